"""Write safetensors files from tensors, one tensor at a time.

`safetensors.torch.save_file` needs every tensor in memory at once and refuses tensors
that share storage. This writer checks each tensor against the header's `TensorSpec` and
hands its bytes to `body.write_safetensors_body` (header first, then the bytes as they
arrive, atomic rename), so memory holds one tensor at a time and tied weights need no
special case (the savers).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import torch

from lr_config import FileDigest
from lr_config.st_format import TensorSpec

from .body import write_safetensors_body
from .read import memory_of

__all__ = ["spec_of", "write_safetensors", "write_tensor_dict"]


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float32` -> `float32`."""
    return str(dtype).removeprefix("torch.")


def spec_of(name: str, tensor: torch.Tensor) -> TensorSpec:
    return TensorSpec(name=name, dtype=dtype_name(tensor.dtype), shape=tuple(tensor.shape))


def _raw_bytes(tensor: torch.Tensor) -> memoryview:
    return memory_of(tensor.detach().to("cpu").contiguous())


def _tensor_bytes(specs: Sequence[TensorSpec], tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[memoryview]:
    """Each tensor's bytes, after checking it is the next one the header promised."""
    expected = iter(specs)
    for name, tensor in tensors:
        spec = next(expected, None)
        if spec is None or spec.name != name or spec_of(name, tensor) != spec:
            raise RuntimeError(f"safetensors writer: got {name!r} {tuple(tensor.shape)} {tensor.dtype}, expected {spec}")
        yield _raw_bytes(tensor)
    if next(expected, None) is not None:
        raise RuntimeError("safetensors writer: fewer tensors than promised in the header")


def write_safetensors(
    path: Path,
    specs: Sequence[TensorSpec],
    tensors: Iterable[tuple[str, torch.Tensor]],
    metadata: Mapping[str, str] | None = None,
) -> FileDigest:
    """Write `tensors` (yielded in `specs` order) to `path` atomically, then check it; return
    the file's digest (size, SHA-256, CRC-32), hashed from the bytes as they were written."""
    return write_safetensors_body(path, specs, _tensor_bytes(specs, tensors), metadata)


def write_tensor_dict(path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> FileDigest:
    """Write an in-memory dict of tensors (sorted by name); return its digest (size, SHA-256, CRC-32)."""
    names = sorted(tensors)
    specs = [spec_of(name, tensors[name]) for name in names]
    return write_safetensors(path, specs, ((name, tensors[name]) for name in names), metadata)
