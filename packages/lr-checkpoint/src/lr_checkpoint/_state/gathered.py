"""The gathered safetensors files of a sharded model, gathered and written one tensor at a time.

A sharded (FSDP2/HSDP) model's `model.safetensors` and `optimizer_state.safetensors` hold
whole tensors. torch's full state dict gathers them all first: the main rank holds the
whole model, or the whole optimizer state, in CPU memory before it writes the first byte,
and the disk idles during the gathers, the network during the writes. `write_gathered`
instead gathers one tensor at a time, in the file's order, on every rank
(`DTensor.full_tensor()`, the same collective torch's full state dict runs per tensor),
and the main rank's writer thread writes each one while the next is gathered. The main
rank holds at most `_DEPTH` + 2 whole tensors; the other ranks drop each one at once.

The gathers are collectives, so every rank runs all of them whatever happens on the main
rank: after a failed write, the main rank drops what it gathers, then every rank raises
the same CheckpointError (`run_on_main`), and the temporary file is gone.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import cast

import torch
from torch.distributed.tensor import DTensor

from lr_config import FileDigest
from lr_config.st_format import TensorSpec

from .._formats.safetensors.write import spec_of, write_safetensors
from .._ranks import is_main, run_on_main

__all__ = ["write_gathered"]

_DEPTH = 2  # whole tensors waiting for the writer: one being written, the next ready
_END = None


class _Writer:
    """The main rank's writer thread: `write_safetensors` over the tensors `put` hands it."""

    def __init__(self, path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None) -> None:
        self._queue: queue.Queue[tuple[str, torch.Tensor] | None] = queue.Queue(maxsize=_DEPTH)
        self._ended = False
        self.failure: Exception | None = None
        self.digest: FileDigest | None = None
        specs = [spec_of(name, tensors[name]) for name in sorted(tensors)]
        self._thread = threading.Thread(target=self._run, args=(path, specs, metadata), name="lr-gathered-write", daemon=True)
        self._thread.start()

    def _items(self) -> Iterator[tuple[str, torch.Tensor]]:
        while (item := self._queue.get()) is not _END:
            yield item
        self._ended = True

    def _fail(self, exc: Exception) -> None:
        """Keep the first failure: a failed copy in `put` also makes the writer see too few tensors."""
        if self.failure is None:
            self.failure = exc

    def _run(self, path: Path, specs: list[TensorSpec], metadata: Mapping[str, str] | None) -> None:
        try:
            self.digest = write_safetensors(path, specs, self._items(), metadata)
        except Exception as exc:  # handed to every rank by `write_gathered`
            self._fail(exc)
        finally:
            while not self._ended:  # keep taking, so that `put` never waits on a writer that stopped
                self._ended = self._queue.get() is _END

    def put(self, name: str, tensor: torch.Tensor) -> None:
        """Hand a gathered tensor to the writer (a copy to the CPU first, on a GPU). A failure
        here is kept, not raised: this tensor's gather is done on every rank, and the others
        must still run theirs (collectives), so the loop goes on and drops the rest."""
        if self.failure is not None:
            return
        try:
            self._queue.put((name, tensor.detach().to("cpu")))
        except Exception as exc:
            self._fail(exc)

    def finish(self) -> None:
        self._queue.put(_END)
        self._thread.join()


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """Collective for a DTensor (every rank, same order): the whole tensor.

    A shard that lives elsewhere than its mesh (FSDP2 with `--accelerator.fsdp.cpu_offload` keeps CPU
    shards on a CUDA mesh, whose NCCL group cannot gather CPU tensors) moves to the mesh's
    device first, as torch's full state dict does; on one device (every CPU run) that is a
    no-op, so CPU and GPU runs take the same path."""
    if not isinstance(tensor, DTensor):
        return tensor
    shard: DTensor = tensor
    if shard.device.type != shard.device_mesh.device_type:
        shard = cast(DTensor, shard.to(shard.device_mesh.device_type))
    return shard.full_tensor()


def write_gathered(path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None, what: str) -> FileDigest | None:
    """Collective: write the whole tensors of `tensors` (this rank's state of a sharded model:
    DTensors and plain tensors, the same names on every rank) to the safetensors file `path`
    on the main rank, in name order; return its digest there (None elsewhere). A failed write
    raises the same CheckpointError on every rank (`what` names the block)."""
    writer: _Writer | None = None
    setup: Exception | None = None  # the main rank's writer could not start: every rank still gathers, then raises
    if is_main():
        try:
            writer = _Writer(path, tensors, metadata)
        except Exception as exc:
            setup = exc
    try:
        for name in sorted(tensors):
            whole = _whole(tensors[name])
            if writer is not None:
                writer.put(name, whole)
            del whole
    finally:
        if writer is not None:
            writer.finish()  # after a failed gather the writer sees too few tensors and removes its file

    def check() -> None:
        if setup is not None:
            raise setup
        assert writer is not None
        if writer.failure is not None:
            raise writer.failure
        if writer.digest is None:  # the thread ended on something other than an Exception
            raise RuntimeError(f"the writer thread of {path} ended without writing it")

    run_on_main(check, what)
    return writer.digest if writer is not None else None
