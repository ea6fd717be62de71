"""Read a safetensors file with one sequential pass, hashing it on the way.

Resume's reader for the gathered `model.safetensors` and `optimizer_state.safetensors`.
Each tensor's bytes go with `readinto` straight into its destination (the live tensor when
it fits, else a new one), each chunk's SHA-256 computed beside the next read
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
from lr_config import FileDigest

from ._errors import CheckpointError
from ._sha import StreamHasher
from ._st_format import DTYPE_CODES, read_header

__all__ = ["CHUNK", "memory_of", "read_into", "read_tensors"]

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
    path: Path, hash_it: bool = True, into: Mapping[str, torch.Tensor] | None = None
) -> tuple[dict[str, torch.Tensor], FileDigest | None]:
    """Every tensor of `path` and the file's size and SHA-256 (None unless `hash_it`).

    A tensor goes straight into `into[name]` when that is a contiguous CPU tensor of the
    same dtype and shape (the live parameters and optimizer state of a plain or DDP model:
    no new memory, so no page faults of a fresh buffer, and no copy after); else into a new
    tensor. The file is read in order, in chunks of at most CHUNK bytes.
    """
    header = read_header(path)
    tensors: dict[str, torch.Tensor] = {}
    try:
        with open(path, "rb", buffering=0) as f, StreamHasher() as hasher:
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
