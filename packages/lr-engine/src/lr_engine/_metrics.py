"""Metrics: accumulated on device, reduced across ranks once per log step.

Every rank calls `MetricsWindow.reduce()` at a log step (it is collective: one all-gather
of each rank's window values, then sums and maxes computed alike on every rank):
- loss and the policy's info scalars: mean over the window's loop steps and over ranks;
- timings: the max over ranks; windows follow each other without a gap (a window's clock
  starts where the previous one's stopped), so the log steps' own cost is counted too;
- `samples_per_s`: the whole cluster's throughput (global samples / slowest rank's time);
- memory: the max over ranks.
With `LR_LOG_RANK_METRICS=1` every rank also appends its own (unreduced) window loss to
`metrics_rank<r>.jsonl`, for debugging imbalance between ranks.
Only the main rank writes (`MetricsSink`): `metrics.jsonl`, the console line, a rich progress
bar when stdout is a TTY, and trackio when enabled. Nothing calls `.item()` per step.

The files of a log step (the metrics line, then `run.json`, which is fsynced) are written by
one background thread, in order, while training goes on: an fsync in the loop stalls every
rank at its next collective, for milliseconds on a local disk (up to 30 ms measured here)
and far longer on the network filesystems that output folders of clusters often live on.
At most one log step's writes are in flight: the next log step, and the end of the loop,
wait for them, and a write that failed raises there.

A resume into the run's own folder from a checkpoint before the last logged step (the run
crashed after logging steps it never saved) first cuts the metrics files back to the
resumed step (`keep_records_through`: a temp file, fsync, rename), so that the steps that
are trained again are not listed twice.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lr_config import MetricsRecord, TrainConfig, to_dict
from lr_config.layout import METRICS


def _kept_line(line: str, step: int) -> bool:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return False  # a line a crash cut short
    return isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= step


def keep_records_through(path: Path, step: int) -> int:
    """Rewrite the JSONL metrics file `path` atomically with only its records up to `step`
    (a line a crash cut short goes too); returns how many lines went. Nothing is written
    when all are kept."""
    if not path.is_file():
        return 0
    lines = path.read_text().splitlines(keepends=True)
    kept = [line if line.endswith("\n") else line + "\n" for line in lines if _kept_line(line, step)]
    if len(kept) == len(lines) and all(line.endswith("\n") for line in lines):
        return 0
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)  # the umask's mode, as the file had
    try:
        with os.fdopen(fd, "w") as f:
            f.writelines(kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself survives a crash
    finally:
        os.close(folder)
    return len(lines) - len(kept)


def _gather(t: torch.Tensor) -> torch.Tensor:
    """Every rank's `t`, stacked (world, *t.shape): one collective for sums and maxes alike."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return t.unsqueeze(0)
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    return torch.stack(parts)


def memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux


@dataclass
class MetricsWindow:
    """Per-rank accumulators between two log steps."""

    device: torch.device
    steps: int = 0
    loss_sum: torch.Tensor | None = None
    info_sums: dict[str, torch.Tensor] = field(default_factory=dict)
    data_s: float = 0.0
    started: float = field(default_factory=time.perf_counter)
    ended: float = 0.0
    """When `reduce()` read the clock: the next window starts there, so that the log step's
    collective and writes count in the next window's time instead of in none."""
    paused_s: float = 0.0
    """Time inside the window that is not training (an --eval_freq evaluation): left out of its timings."""

    def add(self, loss: torch.Tensor, info: dict[str, torch.Tensor], data_s: float) -> None:
        loss = loss.detach().float()
        self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss
        for k, v in info.items():
            v = v.detach().float()
            self.info_sums[k] = v if k not in self.info_sums else self.info_sums[k] + v
        self.data_s += data_s
        self.steps += 1

    def reduce(self, world_size: int, samples_per_step: int) -> dict[str, Any]:
        """Collective: the window's reduced values (identical on every rank)."""
        keys = sorted(self.info_sums)
        assert self.loss_sum is not None
        local = torch.stack([self.loss_sum, *(self.info_sums[k] for k in keys)]).to(self.device) / self.steps
        local_loss = float(local[0]) if os.environ.get("LR_LOG_RANK_METRICS") else None
        self.ended = time.perf_counter()
        wall = self.ended - self.started - self.paused_s
        timings = torch.tensor([wall, self.data_s, memory_gb(self.device)], dtype=torch.float64, device=self.device)
        # One all-gather, not an all-reduce per op: each blocking collective is a point where
        # every rank waits for the slowest (BENCHMARKS.md, measured facts).
        rows = _gather(torch.cat([local.double(), timings]))
        n = len(local)
        values = (rows[:, :n].sum(0) / world_size).tolist()
        wall_max, data_max, mem_max = rows[:, n:].amax(0).tolist()
        return {
            "loss": values[0],
            "info": dict(zip(keys, values[1:])),
            "update_s": (wall_max - data_max) / self.steps,
            "dataloading_s": data_max / self.steps,
            "samples_per_s": samples_per_step * self.steps / max(wall_max, 1e-9),
            "mem_gb": mem_max,
            "local_loss": local_loss,
        }


class MetricsSink:
    """Main-rank writer of metrics.jsonl, the console and trackio."""

    def __init__(self, cfg: TrainConfig, output_dir: Path, total_steps: int, start_step: int) -> None:
        self.path = output_dir / METRICS
        self.total = total_steps
        self.progress: Any = None
        self.task: Any = None
        if sys.stdout.isatty() and not os.environ.get("LR_NO_PROGRESS"):
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(TextColumn("train"), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeRemainingColumn(), transient=True)
            self.task = self.progress.add_task("train", total=total_steps, completed=start_step)
            self.progress.start()
        self.trackio: Any = None
        if cfg.trackio.enable:
            import trackio

            trackio.init(project=cfg.trackio.project, name=cfg.trackio.run_name or cfg.job_name, config=to_dict(cfg))
            self.trackio = trackio
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lr-metrics-io")
        self._pending: Future[None] | None = None

    def advance(self, step: int) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=step)

    def write(self, record: MetricsRecord, then: Callable[[], None] | None = None) -> None:
        """The record's metrics.jsonl line, then `then` (the run.json update), in the background
        thread; the console line and trackio here."""
        self.flush()
        self._pending = self._io.submit(self._append, json.dumps(to_dict(record)) + "\n", then)
        info = " ".join(f"{k} {v:.4f}" for k, v in record.info.items())
        line = (
            f"step {record.step}/{self.total} epoch {record.epoch} loss {record.loss:.4f} {info} "
            f"lr {record.lr:.2e} grad_norm {record.grad_norm:.3f} {record.samples_per_s:.0f} samples/s"
        )
        if self.progress is not None:
            self.progress.console.print(line)
        else:
            print(line, flush=True)
        if self.trackio is not None:
            self.trackio.log({"loss": record.loss, "lr": record.lr, "grad_norm": record.grad_norm, "samples_per_s": record.samples_per_s, **record.info}, step=record.step)

    def _append(self, line: str, then: Callable[[], None] | None) -> None:
        with open(self.path, "a") as f:
            f.write(line)
        if then is not None:
            then()

    def flush(self) -> None:
        """Wait for the writes in flight; a failed one raises here."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self, failed: bool = False) -> None:
        """Finish the writes in flight. On a run that is already failing (`failed`), a failed
        write is reported on stderr instead of replacing the error the run failed with."""
        try:
            self.flush()
        except Exception as exc:
            if not failed:
                raise
            print(f"lr-engine: warning: the last metrics write failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        finally:
            self._io.shutdown(wait=True)
            if self.progress is not None:
                self.progress.stop()
            if self.trackio is not None:
                self.trackio.finish()
