"""Deterministic run folders for the lr-tui tests: metrics, run.json, logs and checkpoints.

Checkpoints hold real safetensors files (written with safetensors.numpy) and real
lr-config contract files (TrainingStep, TrainConfig). DCP shards here are placeholder
files: the TUI only checks that they are present; the Convert test writes a real DCP
checkpoint with torch instead.

`python apps/lr-tui/tests/tui_support.py` regenerates the checked-in `sample_run/`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from lr_config import (
    MetricsRecord,
    RunStatus,
    Topology,
    TrainingStep,
    parse_train_config,
    save_json,
    save_run_status,
    save_training_step,
    to_dict,
)

SAMPLE_RUN = Path(__file__).parent / "sample_run"


def metrics_record(step: int, steps: int = 300) -> MetricsRecord:
    """A smooth, plausible record for `step` (pure function of step)."""
    warm = min(1.0, step / 20)
    lr = 1e-3 * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
    return MetricsRecord(
        step=step,
        epoch=step // 120,
        samples=step * 16,
        loss=2.0 * math.exp(-step / 60) + 0.1 + 0.05 * math.sin(step / 7),
        lr=lr,
        grad_norm=5.0 * math.exp(-step / 90) + 0.3 + 0.2 * math.cos(step / 5),
        update_s=0.041,
        dataloading_s=0.004,
        samples_per_s=350.0 + 20 * math.sin(step / 11),
        mem_gb=0.42,
    )


def metrics_line(step: int) -> str:
    return json.dumps(to_dict(metrics_record(step))) + "\n"


def write_metrics(path: Path, steps: list[int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(metrics_line(s) for s in steps))


def evaluated(step: int, success_rate: float) -> MetricsRecord:
    """`metrics_record(step)` with an --eval_freq evaluation of 50 episodes."""
    from dataclasses import replace

    from lr_config import EvalAggregate

    result = EvalAggregate(n_episodes=50, success_rate=success_rate, success_ci95_low=max(0.0, success_rate - 0.1),
                           success_ci95_high=min(1.0, success_rate + 0.1), avg_sum_reward=-3.5, avg_length=40.0)
    return replace(metrics_record(step), eval=result)


def write_records(path: Path, records: list[MetricsRecord], *, append: bool = False) -> None:
    """These records as metrics.jsonl lines (NaN and inf as Python's json writes them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a" if append else "w") as f:
        f.write("".join(json.dumps(to_dict(r)) + "\n" for r in records))


def write_run_status(
    run_dir: Path,
    *,
    status: str = "running",
    step: int = 200,
    steps: int = 300,
    error: str | None = None,
    pid: int = 0,
    hostname: str = "sample-host",
    started: str = "2025-01-01T12:00:00",
    world_size: int = 2,
) -> None:
    save_run_status(
        run_dir / "run.json",
        RunStatus(
            status=status,  # type: ignore[arg-type]
            pid=pid,
            hostname=hostname,
            started=started,
            updated="2025-01-01T12:00:09",  # 0.045 s per step, the pace of metrics_record
            output_dir=run_dir.name,
            job_name="act",
            step=step,
            steps=steps,
            world_size=world_size,
            error=error,
        ),
    )


GONE_PID = 2**30
"""A pid no process has (above Linux's largest pid_max): a run.json "running" with it on this host is stale."""


def make_run(
    run_dir: Path,
    *,
    started: str,
    status: str = "running",
    step: int = 20,
    steps: int = 100,
    flags: tuple[str, ...] = (),
    world_size: int = 1,
    pid: int = 0,
    hostname: str = "other-host",
) -> Path:
    """A run folder as lr-engine leaves it (no checkpoints): run.json, train_config.json and
    metrics up to `step` (every 10 steps)."""
    from lr_config.layout import METRICS, TRAIN_CONFIG

    run_dir.mkdir(parents=True, exist_ok=True)
    save_json(run_dir / TRAIN_CONFIG, to_dict(parse_train_config([f"--output_dir={run_dir}", *flags])))
    write_metrics(run_dir / METRICS, list(range(10, step + 1, 10)))
    write_run_status(run_dir, status=status, step=step, steps=steps, pid=pid, hostname=hostname, started=started, world_size=world_size)
    return run_dir


def write_weights(path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    """A real safetensors file of zeros with these (dtype, shape) tensors."""
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({name: np.zeros(shape, dtype=dtype) for name, (dtype, shape) in tensors.items()}, str(path))


MODEL_TENSORS = {
    "model.encoder.weight": ("float32", (32, 16)),
    "model.encoder.bias": ("float32", (32,)),
    "model.head.weight": ("float32", (4, 32)),
    "model.head.bias": ("float32", (4,)),
}


def make_checkpoint(
    run_dir: Path,
    step: int,
    *,
    topology: Topology = Topology(world_size=2, dp_replicate=1, dp_shard=2),
    checkpoint_format: str = "safetensors",
    precision: str = "bf16",
    weights: str | None = "model",
    fake_dcp: bool = False,
    batch_size: int = 8,
) -> Path:
    """`<run>/checkpoints/<step:06d>` with contract files, weights and (fake) DCP shards."""
    step_dir = run_dir / "checkpoints" / f"{step:06d}"
    pretrained = step_dir / "pretrained_model"
    flags = [f"--output_dir=outputs/train/{run_dir.name}", f"--batch_size={batch_size}", f"--checkpoint_format={checkpoint_format}"]
    if topology.dp_shard > 1:
        flags.append(f"--parallelism.dp_shard={topology.dp_shard}")
        flags.append(f"--parallelism.dp_replicate={topology.dp_replicate}")
    save_json(pretrained / "train_config.json", to_dict(parse_train_config(flags)))
    if weights == "model":
        write_weights(pretrained / "model.safetensors", MODEL_TENSORS)
    elif weights == "adapter":
        write_weights(pretrained / "adapter_model.safetensors", {"lora_A.weight": ("float32", (4, 16)), "lora_B.weight": ("float32", (32, 4))})
    if fake_dcp:
        shard_dir = pretrained / "pytorch_model_fsdp_0"
        shard_dir.mkdir(parents=True, exist_ok=True)
        (shard_dir / ".metadata").write_bytes(b"\0" * 1200)
        for rank in range(topology.world_size):
            (shard_dir / f"__{rank}_0.distcp").write_bytes(b"\0" * 1400)
    save_training_step(
        step_dir / "training_state" / "training_step.json",
        TrainingStep(
            step=step,
            optimizer_updates=step,
            epoch=step // 120,
            samples_seen=step * batch_size * topology.dp_world_size,
            dp_world_size=topology.dp_world_size,
            batch_size=batch_size,
            precision=precision,
            checkpoint_format=checkpoint_format,
            seed=1000,
            run_id="sample",
            topology=topology,
        ),
    )
    return step_dir


def point_last(run_dir: Path, step: int) -> None:
    link = run_dir / "checkpoints" / "last"
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(f"{step:06d}", link)


def build_sample_run(run_dir: Path) -> Path:
    """The checked-in sample: a running FSDP2 run at step 200 of 300 with two checkpoints."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    write_run_status(run_dir)
    write_metrics(run_dir / "metrics.jsonl", list(range(5, 201, 5)))
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "launch.log").write_text("lr-engine train: FSDP2 dp_replicate=1 dp_shard=2 world=2\nstep 200/300 loss 0.16\n")
    make_checkpoint(run_dir, 100, checkpoint_format="safetensors_dcp", fake_dcp=True)
    make_checkpoint(run_dir, 200, checkpoint_format="dcp", weights=None, fake_dcp=True)
    tmp = run_dir / "checkpoints" / ".tmp-000300" / "pretrained_model"
    tmp.mkdir(parents=True)
    (tmp / "partial").write_text("a step folder being written")
    point_last(run_dir, 200)
    return run_dir


if __name__ == "__main__":
    print(build_sample_run(SAMPLE_RUN))


async def wait_until(pilot, predicate, timeout: float = 30.0, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    """Pause the pilot until `predicate()` is true (workers and subprocesses need a moment)."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await pilot.pause(0.05)


SAMPLE_PLAN = """\
lr-engine dry run: 1 process, nothing will be trained
batch_size 32 x dp_world_size 1 x grad_accum 1 = effective batch 32 (topology: single process dp_replicate=1 dp_shard=1 world=1)
policy act: 1,073,986 parameters (1,073,986 trainable)
FSDP units (the policy's _fsdp_wrap_modules): 5, then the root
  model.vae_encoder.layers.0  ACTEncoderLayer  198,272 params
  model.encoder.layers.0  ACTEncoderLayer  198,272 params
  model.decoder.layers.0  ACTDecoderLayer  264,576 params
per-rank memory estimate (fp32 master weights, adamw): total 8.2 MiB"""


async def sample_planner(argv: list[str]) -> tuple[int, str]:
    """A deterministic stand-in for `lr-engine train --dry_run=true` (snapshots)."""
    return 0, SAMPLE_PLAN


def tables_settled(app) -> bool:  # type: ignore[no-untyped-def]
    """Every DataTable has applied its new rows and cells to its column widths. Textual does
    that when the app is idle; a snapshot taken before (a loaded machine) shows the columns
    as wide as their headers."""
    from textual.widgets import DataTable

    return all(not table._require_update_dimensions and not table._updated_cells for table in app.screen.query(DataTable))


def notices(app, severity: str | None = None) -> list[str]:  # type: ignore[no-untyped-def]
    """The messages of the app's notifications still shown (of one severity, if given)."""
    return [n.message for n in app._notifications if severity is None or n.severity == severity]


def charts_drawn(app) -> bool:  # type: ignore[no-untyped-def]
    """Every chart shown has its plot (mounted right after the first frame, `Deferred`)."""
    from lr_tui._widgets.metric_chart import MetricChart

    return all(chart.plot is not None and chart.plot.is_mounted for chart in app.screen.query(MetricChart) if chart.display)


async def app_ready(pilot) -> None:  # type: ignore[no-untyped-def]
    """Wait until every view is mounted (the hidden ones mount lazily, after the first frame)."""
    app = pilot.app
    await pilot.pause()
    await wait_until(pilot, lambda: all(v.is_mounted for v in (app.launch_view, app.monitor_view, app.checkpoints_view)), what="the views")


class FixedHardware:
    """A hardware source with fixed numbers: a 16-core host and, with `gpus`, two H200s."""

    def __init__(self, gpus: bool = True) -> None:
        self.gpus = gpus
        self.calls = 0

    def sample(self):  # type: ignore[no-untyped-def]
        from lr_tui._hardware import GpuSample, HardwareSample

        self.calls += 1
        gib = 2**30
        if not self.gpus:
            return HardwareSample(37.5, 16, 45 * gib, 125 * gib, gpu_note="no GPU information: nvidia-smi is not on PATH and pynvml is not installed")
        gpus = (GpuSample(0, "NVIDIA H200", 87.0, 61 * gib, 140 * gib), GpuSample(1, "NVIDIA H200", None, 130 * gib, 140 * gib))
        return HardwareSample(37.5, 16, 45 * gib, 125 * gib, gpus, gpu_source="nvidia-smi")
