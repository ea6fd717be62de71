"""What the loop asks at each update: wait for a background save's copy, stop on request, save.

`Checkpointer` owns three rules the loop only calls into:

- the save rule: the update that completes each multiple of `--save_freq` saves (the first
  update at or after it, so any `--save_freq` works with any accumulation K), and so does
  the last update of the run (before `--steps` when a partial accumulation ends it) and an
  update at which every rank agreed to stop;
- the async staging wait: a background save copies the live state, so the next optimizer
  step waits for that copy (its writes and commit go on behind the training);
- the stop protocol (`StopRequest`): SIGINT/SIGTERM ask for a clean stop at an update
  boundary, agreed by all ranks.
"""

from __future__ import annotations

import signal
from typing import Any

import torch
from lr_config import TrainConfig

from . import _checkpointing as checkpointing
from ._parallel.dist import DistContext
from ._run import Run, training_step_record

__all__ = ["Checkpointer", "StopRequest", "completes_save_boundary", "save_steps_text"]


def completes_save_boundary(step: int, k: int, save_freq: int) -> bool:
    """Whether the update at loop step `step` (a multiple of K) completes a multiple of --save_freq:
    the first update at or after each boundary saves, so any --save_freq works with any K."""
    return step // save_freq > (step - k) // save_freq


def save_steps_text(cfg: TrainConfig, count: int = 3) -> str:
    """The first checkpoint steps, for the banner when the accumulation moves them off --save_freq."""
    k, freq = cfg.grad_accum_steps, cfg.save_freq
    steps = [s for s in range(k, min(cfg.steps, freq * (count + 1) + k) + 1, k) if completes_save_boundary(s, k, freq)]
    return ", ".join(str(s) for s in steps[:count])


class Checkpointer:
    """The loop's saves and stops. Every method is called on every rank, in the same order
    (the stop exchange and the saves are collective). Use it as a context manager: the stop
    signals are handled inside it, and leaving it restores the previous handlers."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.stop = StopRequest()

    def __enter__(self) -> Checkpointer:
        self.stop.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.uninstall()

    def batch_ready(self) -> None:
        """A micro-batch was fetched: start exchanging the stop flag behind its forward and backward."""
        self.stop.post(self.run.ctx)

    def before_update(self) -> None:
        """Before an optimizer step: a background save's copy of the state must be done."""
        if self.run.cfg.checkpoint_async:
            checkpointing.wait_for_background_copy()

    def stop_agreed(self) -> bool:
        """After an update: whether every rank stops here (collective)."""
        return self.stop.agreed(self.run.ctx)

    def saves_at(self, step: int) -> bool:
        """The save rule for the update that ends at loop step `step` (the banner says which steps)."""
        cfg = self.run.cfg
        k = cfg.grad_accum_steps
        return cfg.save_checkpoint and (completes_save_boundary(step, k, cfg.save_freq) or step + k > cfg.steps)

    def after_update(self, step: int, stopping: bool) -> None:
        """Save when the rule says so or when stopping; a stop commits an async save before it says so."""
        run = self.run
        if self.saves_at(step) or (stopping and run.cfg.save_checkpoint):
            checkpointing.save(run, step, training_step_record(run, step))
        if stopping:
            run.stopped = True
            checkpointing.finish_pending(run)  # an async save is committed before "stopped ... (checkpoint saved)"
            if run.ctx.is_main:
                saved = " (checkpoint saved)" if run.cfg.save_checkpoint else ""
                print(f"stopped at step {step} on request{saved}", flush=True)

    def finish(self) -> None:
        """After the loop ended without an error: the exchange still in flight (a partial last
        accumulation posts one that no update collects), then the background save's commit."""
        self.stop.drain()
        checkpointing.finish_pending(self.run)


class StopRequest:
    """SIGINT/SIGTERM ask for a clean stop at an update boundary, agreed by all ranks.

    The flag travels over the control group (gloo, CPU), so no rank stops alone and a GPU
    run pays no device sync for it. It is exchanged without stalling the loop: `post()`
    starts a non-blocking all-reduce when a step's batch is ready, and `agreed()` collects
    it at the update, after the forward and backward it overlapped with. A blocking
    exchange at every update was one more point per step where each rank waits for the
    slowest (measured: about 4.6 ms per step of 2-rank DDP on CPU, 2% of the step;
    BENCHMARKS.md, measured facts). A request is thus honoured at the first update whose exchange
    started after it, one update later at most. A second signal interrupts at once.
    """

    def __init__(self) -> None:
        self.requested = False
        self.previous: dict[int, Any] = {}
        self.pending: tuple[Any, torch.Tensor] | None = None

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def uninstall(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous.clear()

    def post(self, ctx: DistContext) -> None:
        """Start exchanging the flag (collective, non-blocking); a no-op while one is in flight."""
        if ctx.control_group is None or self.pending is not None:
            return
        flag = torch.tensor([1 if self.requested else 0], dtype=torch.int32)
        work = torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=ctx.control_group, async_op=True)
        self.pending = (work, flag)

    def agreed(self, ctx: DistContext) -> bool:
        """Whether every rank stops at this update: the posted exchange's result (collective)."""
        if ctx.control_group is None:
            return self.requested
        self.post(ctx)
        assert self.pending is not None
        work, flag = self.pending
        self.pending = None
        work.wait()
        return bool(flag.item())

    def drain(self) -> None:
        """Wait for an exchange still in flight (every rank posted it): before other collectives end the run."""
        if self.pending is not None:
            self.pending[0].wait()
            self.pending = None
