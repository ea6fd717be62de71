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

from ._errors import CheckpointError
from ._st_format import TensorSpec, build_header

__all__ = ["spec_of", "write_safetensors", "write_tensor_dict", "check_readable"]


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float32` -> `float32`."""
    return str(dtype).removeprefix("torch.")


def spec_of(name: str, tensor: torch.Tensor) -> TensorSpec:
    return TensorSpec(name=name, dtype=dtype_name(tensor.dtype), shape=tuple(tensor.shape))


def _raw_bytes(tensor: torch.Tensor) -> memoryview:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data


def _write_body(f: IO[bytes], specs: Sequence[TensorSpec], tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    expected = iter(specs)
    for name, tensor in tensors:
        spec = next(expected, None)
        if spec is None or spec.name != name or spec_of(name, tensor) != spec:
            raise RuntimeError(f"safetensors writer: got {name!r} {tuple(tensor.shape)} {tensor.dtype}, expected {spec}")
        f.write(_raw_bytes(tensor))
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
) -> None:
    """Write `tensors` (yielded in `specs` order) to `path` atomically, then check it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(tmp, "xb") as f:  # plain open: the file gets the umask's mode, like any other
            f.write(build_header(specs, dict(metadata) if metadata else None))
            _write_body(f, specs, tensors)
            f.flush()
            os.fsync(f.fileno())
        check_readable(tmp, specs)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_tensor_dict(path: Path, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None) -> None:
    """Write an in-memory dict of tensors (sorted by name)."""
    names = sorted(tensors)
    specs = [spec_of(name, tensors[name]) for name in names]
    write_safetensors(path, specs, ((name, tensors[name]) for name in names), metadata)
