"""Rank helpers that also work in one process without a process group.

Rank and world size come from `torch.distributed` when a process group is initialized,
else rank 0 of 1. torch is not imported here: a process that never imported
`torch.distributed` has no process group (so the offline converter runs without torch).
The main rank is global rank 0. `run_on_main` runs a block on the main rank only and
re-raises its failure on every rank, so a rank-0 error (a full disk, a bad callback) never
leaves the other ranks waiting forever at the next collective.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from lr_config import CheckpointError

if TYPE_CHECKING:
    import torch.distributed as dist

__all__ = [
    "barrier",
    "broadcast_value",
    "collector_paused",
    "gather_values",
    "is_distributed",
    "is_main",
    "pause_point",
    "rank",
    "run_on_every_rank",
    "run_on_main",
    "world_size",
]

T = TypeVar("T")

PAUSE_ENV = "LR_TEST_PAUSE_IN_SAVE"
PAUSE_POINTS = ("before_shards", "between_shards", "before_rename", "before_last")


def is_distributed() -> bool:
    module = sys.modules.get("torch.distributed")
    return module is not None and bool(module.is_available() and module.is_initialized())


def rank() -> int:
    return sys.modules["torch.distributed"].get_rank() if is_distributed() else 0


def world_size() -> int:
    return sys.modules["torch.distributed"].get_world_size() if is_distributed() else 1


def is_main() -> bool:
    return rank() == 0


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector stays off for the block (a collective save or load),
    then is on again, unless the caller had turned it off.

    A full collection walks every object the process tracks: after `import torch` and a
    model, one took 170-190 ms on the benchmark machine, and it starts wherever the
    allocation count happens to cross its threshold. Inside a collective save or load, the
    rank it hits arrives that much later at the next agreement and every other rank waits:
    the first two-rank DCP loads of a process lost 0.17-0.19 s to one (from the page cache
    they took 0.28-0.38 s; with the collector paused, 0.16-0.17 s). A save or load creates
    few objects that outlive it, so nothing piles up meanwhile; a collection due starts after
    the block."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def barrier() -> None:
    if is_distributed():
        import torch.distributed as dist

        dist.barrier()


def broadcast_value(value: T, group: dist.ProcessGroup | None = None) -> T:
    """The main rank's `value` on every rank (a small picklable object). `group`: a group of
    every rank, for a thread other than the training's (the background commit)."""
    if not is_distributed():
        return value
    import torch.distributed as dist

    box: list[object] = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]  # type: ignore[return-value]


def gather_values(value: T, group: dist.ProcessGroup | None = None) -> list[T] | None:
    """Every rank's `value`, in rank order, on the main rank; None elsewhere."""
    if not is_distributed():
        return [value]
    import torch.distributed as dist

    out: list[object] | None = [None] * world_size() if is_main() else None
    dist.gather_object(value, out, dst=0, group=group)
    return out  # type: ignore[return-value]


def run_on_main(block: Callable[[], None], what: str, group: dist.ProcessGroup | None = None) -> None:
    """Run `block` on the main rank; if it fails there, every rank raises: a CheckpointError
    the same one everywhere, another failure a CheckpointError naming it."""
    failure: Exception | None = None
    if is_main():
        try:
            block()
        except Exception as exc:
            failure = exc
    told: str | tuple[str, list[str]] | None = None
    if isinstance(failure, CheckpointError):
        told = (str(failure), failure.problems)
    elif failure is not None:
        told = f"{type(failure).__name__}: {failure}"
    message = broadcast_value(told, group)
    if isinstance(failure, CheckpointError):
        raise failure
    if isinstance(message, tuple):  # the main rank's CheckpointError
        raise CheckpointError(message[0], problems=message[1])
    if isinstance(failure, OSError):
        # A full disk, a file size limit, a read-only folder: name what was being written and
        # what is safe, instead of a bare traceback. `last` only ever moves atomically, so it still
        # names a complete checkpoint, whichever block of a save failed (this one also runs the commit).
        raise CheckpointError(
            f"{what} failed ({failure}); `last` still names a complete checkpoint: free space on that disk "
            "(or raise the file size limit), or pick another --output_dir, then resume"
        ) from None
    if failure is not None:
        raise failure
    if message is not None:
        raise CheckpointError(f"{what} failed on the main rank ({message}); see the main rank's output")


def run_on_every_rank(block: Callable[[], None], what: str) -> None:
    """Run `block` on every rank; if it fails anywhere, every rank raises: the same
    CheckpointError when the first failure (by rank) is one, else the failing rank re-raises
    its own exception and the others a CheckpointError naming it."""
    failure: Exception | None = None
    try:
        block()
    except Exception as exc:
        failure = exc
    mine = None if failure is None else (isinstance(failure, CheckpointError), str(failure), failure.problems if isinstance(failure, CheckpointError) else [])
    everyone = gather_values(mine)
    first = broadcast_value(next(((r, f) for r, f in enumerate(everyone or []) if f is not None), None))
    if first is None:
        return
    failed_rank, (is_checkpoint_error, message, problems) = first
    if is_checkpoint_error:
        raise CheckpointError(message, problems=problems)
    if failure is not None:
        raise failure
    raise CheckpointError(f"{what} failed on rank {failed_rank} ({message}); see that rank's output")


def pause_point(point: str, checkpoints_dir: Path) -> None:
    """Test hook: with LR_TEST_PAUSE_IN_SAVE=<point>, the main rank marks and sleeps here."""
    if os.environ.get(PAUSE_ENV) != point or not is_main():
        return
    (checkpoints_dir / f".paused-{point}").write_text(f"{os.getpid()}\n")
    time.sleep(300)  # the test kills this process long before
