"""The state of one run as the loop and the checkpointing share it (`Run`), and the
`training_step.json` record of a step. The loop (`_train`) and the checkpoints
(`_checkpointing`) both import it; neither imports the other's module for it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from lr_config import EvalAggregate, RunStatus, TrainConfig, TrainingStep
from torch import nn

from ._parallel.dist import DistContext
from ._parallel.precision import effective_dtypes
from ._parallel.wrap import WrapPlan
from ._setup import Data

if TYPE_CHECKING:
    from lr_config import AdapterBase

    from ._faults import FaultHook

__all__ = ["Run", "training_step_record"]


@dataclass
class Run:
    cfg: TrainConfig
    ctx: DistContext
    data: Data
    policy: nn.Module
    model: nn.Module
    plan: WrapPlan | None
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    run_id: str
    start_step: int = 0
    start_samples: int = 0
    """Samples consumed before start_step (a resumed checkpoint's samples_seen)."""
    current_step: int = 0
    updates: int = 0
    skipped_updates: int = 0
    stopped: bool = False
    grad_norm: torch.Tensor = field(default_factory=lambda: torch.zeros(()))
    status: RunStatus = field(default_factory=RunStatus)
    base_record: AdapterBase | None = None
    """LoRA: the base the adapters train on (recorded in each adapter folder)."""
    resumed_into_own_folder: bool = False
    last_eval: tuple[int, EvalAggregate] | None = None
    """The step and result of the run's last --eval_freq evaluation (main rank; a resume brings back the checkpoint's)."""
    fault: FaultHook | None = None
    """Tests only: the fault to inject before an update (`_faults.py`, LR_TEST_* variables)."""

    @property
    def output_dir(self) -> Path:
        assert self.cfg.output_dir is not None
        return self.cfg.output_dir

    @property
    def samples_per_step(self) -> int:
        return self.cfg.batch_size * self.ctx.topology.dp_world_size

    def samples_at(self, step: int) -> int:
        """Samples consumed by the end of loop step `step`, over every resume (whose global batches may differ)."""
        return self.start_samples + (step - self.start_step) * self.samples_per_step


def training_step_record(run: Run, step: int) -> TrainingStep:
    cfg = run.cfg
    position = run.data.sampler.position_after(step - run.start_step)
    return TrainingStep(
        step=step,
        optimizer_updates=run.updates,
        epoch=position.epoch,
        epoch_offset=position.step_in_epoch * run.data.sampler.global_batch,
        samples_seen=run.samples_at(step),
        dp_world_size=run.ctx.topology.dp_world_size,
        batch_size=cfg.batch_size,
        grad_accum=cfg.grad_accum_steps,
        precision=cfg.accelerator.mixed_precision,
        checkpoint_format=cfg.checkpoint_format,
        peft=cfg.peft.method_type is not None,
        seed=cfg.seed,
        run_id=run.run_id,
        topology=run.ctx.topology,
        **effective_dtypes(cfg, run.ctx.topology.sharded),
        last_eval_step=run.last_eval[0] if run.last_eval else None,
        last_eval=run.last_eval[1] if run.last_eval else None,
    )
