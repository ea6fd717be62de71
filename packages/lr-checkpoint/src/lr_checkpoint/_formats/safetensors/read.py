"""Read a safetensors file with one sequential pass, hashing it on the way.

Resume's reader for the gathered `model.safetensors` and `optimizer_state.safetensors`.
Each tensor's bytes go with `readinto` straight into its destination (the live tensor when
it fits, else a new one), each chunk's checksums computed beside the next read
(`StreamHasher`). `safetensors.load_file` maps the file and copies each tensor out of the
mapping into new memory: page-fault reads, fresh pages, a second copy into the model, and
the bytes still had to be read again for the checksum. The header is checked first
(`read_header`), so a truncated or damaged file is a CheckpointError naming it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch
from lr_config import CheckpointError, FileDigest
from torch.distributed.tensor import DTensor
from lr_config.st_format import DTYPE_CODES, read_header

from ..._io.hashing import StreamHasher

__all__ = ["CHUNK", "memory_of", "read_into", "read_local_shards", "read_tensors"]

CHUNK = 16 << 20
_DTYPES: dict[str, torch.dtype] = {code: getattr(torch, name) for name, code in DTYPE_CODES.items()}


def memory_of(tensor: torch.Tensor) -> memoryview:
    """The writable bytes of a contiguous CPU tensor: what a read into it fills."""
    assert tensor.device.type == "cpu" and tensor.is_contiguous()
    return tensor.detach().reshape(-1).view(torch.uint8).numpy().data


def read_into(fd: int, tensor: torch.Tensor, start: int, hasher: StreamHasher | None = None) -> None:
    """Fill `tensor` with the bytes of the open file `fd` from offset `start` (positioned reads
    of at most CHUNK bytes), hashing each chunk beside the next read when `hasher` is given."""
    view = memory_of(tensor)
    position = 0
    while position < len(view):
        got = os.preadv(fd, [view[position : position + CHUNK]], start + position)
        if not got:
            raise OSError(f"unexpected end of file at byte {start + position}")
        if hasher is not None:
            hasher.update(view[position : position + got])
        position += got


def _fits(target: torch.Tensor | None, dtype: torch.dtype, shape: tuple[int, ...]) -> bool:
    """Whether the file's bytes can be read straight into `target`'s memory: a plain
    contiguous CPU tensor (not a DTensor shard, not on a GPU) of this dtype and shape."""
    return (
        isinstance(target, torch.Tensor)
        and type(target) in (torch.Tensor, torch.nn.Parameter)
        and target.device.type == "cpu"
        and target.dtype == dtype
        and tuple(target.shape) == shape
        and target.is_contiguous()
    )


def read_tensors(
    path: Path, hash_it: bool = True, into: Mapping[str, torch.Tensor] | None = None, sha256: bool = True
) -> tuple[dict[str, torch.Tensor], FileDigest | None]:
    """Every tensor of `path` and the file's digest (None unless `hash_it`): its size and
    CRC-32, and its SHA-256 unless `sha256=False`.

    A tensor goes straight into `into[name]` when that is a contiguous CPU tensor of the
    same dtype and shape (the live parameters and optimizer state of a plain or DDP model:
    no new memory, so no page faults of a fresh buffer, and no copy after); else into a new
    tensor. The file is read in order, in chunks of at most CHUNK bytes.
    """
    header = read_header(path)
    tensors: dict[str, torch.Tensor] = {}
    try:
        with open(path, "rb", buffering=0) as f, StreamHasher(sha256) as hasher:
            head = f.read(header.data_start)
            if len(head) != header.data_start:
                raise CheckpointError(f"{path}: the file shrank while it was read; re-create it")
            if hash_it:
                hasher.update(head)
            for name, entry in sorted(header.tensors.items(), key=lambda item: item[1].begin):
                dtype = _DTYPES[entry.code]
                target = (into or {}).get(name)
                if not _fits(target, dtype, entry.shape):
                    target = torch.empty(entry.shape, dtype=dtype)
                assert target is not None
                read_into(f.fileno(), target, header.data_start + entry.begin, hasher if hash_it else None)
                tensors[name] = target
            digest = hasher.digest() if hash_it else None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc})") from None
    return tensors, digest


def _local_block(target: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...]]:
    """(this rank's tensor, its offsets and sizes in the full tensor) of a DTensor shard (its
    one chunk, as DCP's planner sees it), or of a plain tensor (all of it)."""
    if not isinstance(target, DTensor):
        return target, (0,) * target.dim(), tuple(target.shape)
    chunks = target.__create_chunk_list__()  # type: ignore[no-untyped-call]
    if len(chunks) != 1:
        raise CheckpointError(f"a DTensor with {len(chunks)} chunks on one rank; load this layout from DCP shards")
    return target.to_local(), tuple(chunks[0].offsets), tuple(chunks[0].sizes)


def read_local_shards(path: Path, targets: Mapping[str, torch.Tensor]) -> None:
    """Fill each tensor of `targets` (an FSDP2/HSDP model's or optimizer's local state: DTensor
    shards, and plain tensors such as buffers) with its own part of the full tensor of the same
    name in the gathered safetensors file `path`. Each rank reads only its rows: a dim-0 shard
    of a row-major tensor is one contiguous byte range, read straight into the shard when it
    fits (`read_into`), else into a buffer of those rows that is then sliced and copied (a
    shard along another dim, another dtype, a GPU shard). Names and shapes must have been
    checked against the header. No collective; the file is not hashed (`ChecksumCheck` does).
    """
    header = read_header(path)
    try:
        with open(path, "rb", buffering=0) as f:
            for name, target in sorted(targets.items(), key=lambda item: header.tensors[item[0]].begin):
                entry = header.tensors[name]
                dtype = _DTYPES[entry.code]
                local, offsets, sizes = _local_block(target)
                if local.numel() == 0:
                    continue
                start = header.data_start + entry.begin
                if not sizes:  # a 0-dim tensor
                    block = local if _fits(local, dtype, ()) else torch.empty((), dtype=dtype)
                    read_into(f.fileno(), block, start)
                else:
                    row_bytes = dtype.itemsize * int(torch.Size(entry.shape[1:]).numel())
                    rows = (sizes[0], *entry.shape[1:])
                    whole_rows = tuple(sizes[1:]) == tuple(entry.shape[1:])
                    block = local if whole_rows and _fits(local, dtype, rows) else torch.empty(rows, dtype=dtype)
                    read_into(f.fileno(), block, start + offsets[0] * row_bytes)
                    for dim in range(1, len(sizes)):
                        block = block.narrow(dim, offsets[dim], sizes[dim])
                if block is not local:
                    local.copy_(block)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc})") from None
