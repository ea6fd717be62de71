"""Read a whole safetensors file into memory with one sequential pass, hashing it on the way.

Resume's reader for the gathered `model.safetensors` and `optimizer_state.safetensors`. The
file goes into one byte buffer with large `readinto` calls (what a raw sequential read
does), each chunk's SHA-256 computed beside the next read (`StreamHasher`), and every
tensor is a view into that buffer. `safetensors.load_file` maps the file and copies each
tensor out of the mapping: page-fault reads, a second copy, and the bytes still had to be
read again for the checksum. The header is checked first (`read_header`), so a truncated
or damaged file is a CheckpointError naming it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from lr_config import FileDigest

from ._errors import CheckpointError
from ._sha import StreamHasher
from ._st_format import DTYPE_CODES, read_header

__all__ = ["read_tensors"]

_CHUNK = 16 << 20
_DTYPES: dict[str, torch.dtype] = {code: getattr(torch, name) for name, code in DTYPE_CODES.items()}


def read_tensors(path: Path, hash_it: bool = True) -> tuple[dict[str, torch.Tensor], FileDigest | None]:
    """Every tensor of `path` (views into one buffer) and the file's size and SHA-256 (None
    unless `hash_it`)."""
    header = read_header(path)
    size = header.data_start + header.data_bytes
    buffer = torch.empty(size, dtype=torch.uint8)
    view = buffer.numpy().data
    try:
        with open(path, "rb", buffering=0) as f, StreamHasher() as hasher:
            position = 0
            while position < size:
                got = f.readinto(view[position : position + _CHUNK])
                if not got:
                    raise CheckpointError(f"{path}: the file shrank while it was read; re-create it")
                if hash_it:
                    hasher.update(view[position : position + got])
                position += got
            digest = hasher.digest() if hash_it else None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc})") from None
    tensors = {}
    for name, entry in header.tensors.items():
        dtype = _DTYPES[entry.code]
        raw = buffer[header.data_start + entry.begin : header.data_start + entry.end]
        if raw.storage_offset() % dtype.itemsize:
            raw = raw.clone()  # a view of another dtype must start at a multiple of its item size
        tensors[name] = raw.view(dtype).reshape(entry.shape)
    return tensors, digest
