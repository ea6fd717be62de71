"""Write safetensors files one tensor at a time.

`safetensors.torch.save_file` needs every tensor in memory at once and refuses tensors
that share storage. This writer emits the header from `TensorSpec`s first, then appends
each tensor's bytes as it arrives, so memory holds one tensor at a time (the converter)
and tied weights need no special case (the savers). The file is written under a
temporary name, fsynced, checked with `safe_open`, then renamed into place.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO

import torch
from safetensors import safe_open

from lr_config import FileDigest

from ._errors import CheckpointError
from ._sha import StreamHasher
from ._st_format import TensorSpec, build_header
from ._st_read import memory_of

__all__ = ["spec_of", "write_safetensors", "write_tensor_dict", "check_readable"]


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float32` -> `float32`."""
    return str(dtype).removeprefix("torch.")


def spec_of(name: str, tensor: torch.Tensor) -> TensorSpec:
    return TensorSpec(name=name, dtype=dtype_name(tensor.dtype), shape=tuple(tensor.shape))


def _raw_bytes(tensor: torch.Tensor) -> memoryview:
    return memory_of(tensor.detach().to("cpu").contiguous())


def _write_body(f: IO[bytes], specs: Sequence[TensorSpec], tensors: Iterable[tuple[str, torch.Tensor]], hasher: StreamHasher) -> None:
    expected = iter(specs)
    for name, tensor in tensors:
        spec = next(expected, None)
        if spec is None or spec.name != name or spec_of(name, tensor) != spec:
            raise RuntimeError(f"safetensors writer: got {name!r} {tuple(tensor.shape)} {tensor.dtype}, expected {spec}")
        data = _raw_bytes(tensor)
        hasher.update(data)  # hashed beside the write; `data` stays alive until the next update
        f.write(data)
    if next(expected, None) is not None:
        raise RuntimeError("safetensors writer: fewer tensors than promised in the header")


def check_readable(path: Path, specs: Sequence[TensorSpec]) -> None:
    """Open `path` with safetensors itself and check every promised name, dtype and shape."""
    try:
        with safe_open(str(path), framework="pt") as f:
            names = set(f.keys())
            for spec in specs:
                if spec.name not in names:
                    raise CheckpointError(f"{path}: tensor {spec.name!r} missing after writing")
                shape = tuple(f.get_slice(spec.name).get_shape())
                if shape != spec.shape:
                    raise CheckpointError(f"{path}: tensor {spec.name!r} has shape {shape}, expected {spec.shape}")
    except CheckpointError:
        raise
    except Exception as exc:  # safetensors raises its own error types for damaged files
        raise CheckpointError(f"{path}: safetensors cannot read the file back ({exc})") from None


def write_safetensors(
    path: Path,
    specs: Sequence[TensorSpec],
    tensors: Iterable[tuple[str, torch.Tensor]],
    metadata: Mapping[str, str] | None = None,
) -> FileDigest:
    """Write `tensors` (yielded in `specs` order) to `path` atomically, then check it; return
    the file's digest (size, SHA-256, CRC-32), hashed from the bytes as they were written."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f, StreamHasher() as hasher:  # plain open: the file gets the umask's mode
            header = build_header(specs, dict(metadata) if metadata else None)
            hasher.update(header)
            f.write(header)
            _write_body(f, specs, tensors, hasher)
            digest = hasher.digest()
            os.fsync(f.fileno())
        check_readable(tmp, specs)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return digest


def write_tensor_dict(path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> FileDigest:
    """Write an in-memory dict of tensors (sorted by name); return its digest (size, SHA-256, CRC-32)."""
    names = sorted(tensors)
    specs = [spec_of(name, tensors[name]) for name in names]
    return write_safetensors(path, specs, ((name, tensors[name]) for name in names), metadata)
