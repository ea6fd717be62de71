"""`--eval_freq`: the policy rolled out in the demo's reaching task while it trains.

At the update that completes each multiple of `--eval_freq` (the save rule's boundary, so any
accumulation K works), and at the run's last update:

1. every rank joins the gather of the full model state (collective, as a save's gather);
2. the main rank loads it into its own unsharded copy of the policy (built once, outside any
   DDP/FSDP wrapper, LoRA adapters included, with torch's RNG forked so that building it
   changes no random draw of the training) and rolls it out with the run's normalizers:
   `_eval.evaluate`, the episodes and seeds `lr-engine eval --seed=<the run's seed>` uses;
3. the other ranks wait for it in a barrier on a gloo group of their own whose timeout is a
   week: an evaluation may take longer than the collective timeout (LR_DIST_TIMEOUT_S), which
   keeps guarding every training collective. One path for gloo and NCCL runs.

The result goes into that step's metrics.jsonl record (`MetricsRecord.eval`), is printed, and
is kept as the run's last evaluation, which each later checkpoint's training_step.json records.
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist
from lr_config import EvalAggregate, EvalRunConfig, TrainConfig
from lr_config.layout import TRAIN_EVALS

from . import _faults
from ._checkpointer import completes_save_boundary
from ._eval import aggregate, evaluate, policy_actor, policy_cameras
from ._run import Run

__all__ = ["TrainingEval", "check_eval_env"]

_WAIT = timedelta(days=7)


def check_eval_env(cfg: TrainConfig) -> None:
    """Before training: the environment gives every input the policy takes (names --eval_freq)."""
    if cfg.eval_freq > 0:
        assert cfg.policy.input_features is not None
        policy_cameras(cfg.policy.input_features, flag="--eval_freq")


class TrainingEval:
    """The loop's evaluations. Build it on every rank, in the same order (it makes a process group)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.freq = run.cfg.eval_freq
        self.delay = _faults.eval_delay()  # tests only
        self.twin: torch.nn.Module | None = None
        self.wait_group: dist.ProcessGroup | None = None
        if self.freq > 0 and run.ctx.distributed:
            self.wait_group = dist.new_group(backend="gloo", timeout=_WAIT)

    def due(self, step: int) -> bool:
        cfg = self.run.cfg
        k = cfg.grad_accum_steps
        return self.freq > 0 and (completes_save_boundary(step, k, self.freq) or step + k > cfg.steps)

    def __call__(self, step: int) -> EvalAggregate | None:
        """Collective: the evaluation at loop step `step`; its result on the main rank, None elsewhere."""
        from lr_checkpoint import gather_model_state_dict

        run = self.run
        state = gather_model_state_dict(run.model)
        result = self._roll_out(state, step) if run.ctx.is_main else None
        if self.wait_group is not None:
            dist.barrier(group=self.wait_group)
        if result is not None:
            run.last_eval = (step, result)
        return result

    def _roll_out(self, state: dict[str, torch.Tensor], step: int) -> EvalAggregate:
        run, cfg = self.run, self.run.cfg
        started = time.perf_counter()
        twin = self._twin()
        twin.load_state_dict(state)
        twin.eval()
        assert cfg.policy.input_features is not None
        act = policy_actor(twin, run.data.pre, run.data.post, run.ctx.device)
        videos = run.output_dir / TRAIN_EVALS / f"{step:06d}" / "videos" if cfg.eval.videos else None
        episodes, _ = evaluate(EvalRunConfig(eval=cfg.eval, env=cfg.env, seed=cfg.seed), act,
                               policy_cameras(cfg.policy.input_features, flag="--eval_freq"), twin.reset, videos)
        result = aggregate(episodes)
        if self.delay:
            time.sleep(self.delay)
            self.delay = 0.0
        print(f"eval at step {step}: {result.n_episodes} episodes, success {100 * result.success_rate:.1f}% "
              f"(95% CI {100 * result.success_ci95_low:.1f}-{100 * result.success_ci95_high:.1f}%), "
              f"avg sum reward {result.avg_sum_reward:.2f}, {time.perf_counter() - started:.1f}s"
              + (f"; videos in {videos}" if videos is not None else ""), flush=True)
        return result

    def _twin(self) -> torch.nn.Module:
        """The main rank's unsharded copy of the policy, built once without touching the run's RNG."""
        if self.twin is None:
            from ._policies import make_policy

            cfg = self.run.cfg
            devices = [self.run.ctx.device] if self.run.ctx.device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices):
                twin: torch.nn.Module = make_policy(cfg.policy)
                if cfg.peft.method_type is not None:
                    from ._adapters import apply_lora

                    twin = apply_lora(twin, cfg)
            self.twin = twin.to(self.run.ctx.device)
        return self.twin

