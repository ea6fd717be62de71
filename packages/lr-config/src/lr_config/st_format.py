"""The safetensors file format, without torch: headers out of specs, headers read back.

A file is an 8-byte little-endian header length N, N bytes of JSON (padded with spaces
to a multiple of 8) mapping each name to `dtype`, `shape` and `data_offsets` (relative to
the end of the header), an optional `__metadata__` of strings, then the raw bytes in
offset order with no gaps.

`build_header` lets a writer emit the header before it has read a single tensor (the
streaming converter); `read_header` checks a file against its header and is what
inspect, verify and every loader call first, so a truncated file is a clear error.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ._errors import CheckpointError

__all__ = ["Entry", "Header", "TensorSpec", "build_header", "byte_size", "itemsize", "read_header", "DTYPE_CODES", "ITEM_SIZES"]

# torch dtype name -> safetensors code
DTYPE_CODES: dict[str, str] = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}
ITEM_SIZES: dict[str, int] = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
    "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
}
_MAX_HEADER = 100 * 1024 * 1024


def itemsize(dtype: str) -> int:
    """Bytes per element of a torch dtype name (`float32` -> 4)."""
    return ITEM_SIZES[DTYPE_CODES[dtype]]


def byte_size(dtype: str, shape: Sequence[int]) -> int:
    """Bytes of a contiguous tensor of this torch dtype name and shape."""
    return math.prod(shape) * itemsize(dtype)


@dataclass(frozen=True)
class TensorSpec:
    """Name, torch dtype name and shape of one tensor to be written."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return byte_size(self.dtype, self.shape)


@dataclass(frozen=True)
class Entry:
    """One tensor of a safetensors header: dtype code, shape, byte range in the data."""

    code: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Header:
    """A parsed safetensors header, consistent with the file's size."""

    tensors: dict[str, Entry]
    metadata: dict[str, str]
    data_start: int
    data_bytes: int

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: entry.shape for name, entry in self.tensors.items()}


def build_header(specs: Sequence[TensorSpec], metadata: dict[str, str] | None = None) -> bytes:
    """Length prefix + padded JSON header for `specs`, laid out in the given order."""
    entries: dict[str, object] = {}
    if metadata:
        entries["__metadata__"] = dict(metadata)
    offset = 0
    for spec in specs:
        if spec.dtype not in DTYPE_CODES:
            raise CheckpointError(f"tensor {spec.name!r}: dtype {spec.dtype} cannot be stored in safetensors")
        end = offset + spec.nbytes
        entries[spec.name] = {"dtype": DTYPE_CODES[spec.dtype], "shape": list(spec.shape), "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _parse_json(path: Path, raw: bytes) -> dict[str, object]:
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: corrupt safetensors header ({exc}); the file is damaged, re-create it") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (not a JSON object); the file is damaged")
    return data


def _check_entry(path: Path, name: str, entry: object) -> Entry:
    bad = f"{path}: corrupt safetensors header entry {name!r}"
    if not isinstance(entry, dict):
        raise CheckpointError(bad)
    code, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if code not in ITEM_SIZES or not isinstance(shape, list) or not isinstance(offsets, list) or len(offsets) != 2:
        raise CheckpointError(bad)
    if not all(isinstance(d, int) and d >= 0 for d in shape) or not all(isinstance(o, int) for o in offsets):
        raise CheckpointError(bad)
    begin, end = offsets
    if end - begin != math.prod(shape) * ITEM_SIZES[str(code)]:
        raise CheckpointError(f"{bad}: its byte range does not match its shape and dtype")
    return Entry(code=str(code), shape=tuple(shape), begin=begin, end=end)


def _check_ranges(path: Path, entries: list[Entry], data_bytes: int) -> None:
    position = 0
    for begin, end in sorted((e.begin, e.end) for e in entries):
        if begin != position:
            raise CheckpointError(f"{path}: corrupt safetensors header (tensor byte ranges overlap or leave gaps)")
        position = end
    if position != data_bytes:
        raise CheckpointError(
            f"{path}: truncated or padded file: the header promises {position} bytes of tensor data, "
            f"the file holds {data_bytes}; the save was interrupted or the copy is incomplete, re-create the file"
        )


def read_header(path: Path) -> Header:
    """Parse and check a safetensors header against the file size (reads no tensor data)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes); re-create it")
            (length,) = struct.unpack("<Q", prefix)
            if length > min(_MAX_HEADER, size - 8):
                raise CheckpointError(f"{path}: truncated or corrupt safetensors file (header of {length} bytes in a {size}-byte file); re-create it")
            raw = f.read(length)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc})") from None
    data = _parse_json(path, raw)
    meta = data.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise CheckpointError(f"{path}: corrupt safetensors header (__metadata__ must map strings to strings)")
    tensors = {name: _check_entry(path, name, entry) for name, entry in data.items()}
    data_bytes = size - 8 - length
    _check_ranges(path, list(tensors.values()), data_bytes)
    return Header(tensors=tensors, metadata={str(k): str(v) for k, v in meta.items()}, data_start=8 + length, data_bytes=data_bytes)
