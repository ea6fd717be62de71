"""Read a safetensors file's header without loading a tensor (and without torch or numpy).

The format: an 8-byte little-endian header length N, then N bytes of JSON mapping each
tensor name to `{dtype, shape, data_offsets}` (plus an optional `__metadata__`), then the
raw bytes. Only the header is read, so this is instant even for a multi-GB file.
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["TensorSummary", "read_header", "summarize_tensors"]

_MAX_HEADER = 100 * 1024 * 1024


class HeaderError(ValueError):
    """The file is not a readable safetensors file."""


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file; HeaderError when the file is not one."""
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise HeaderError(f"{path.name}: too short for a safetensors file")
        (length,) = struct.unpack("<Q", prefix)
        if length > min(_MAX_HEADER, size - 8):
            raise HeaderError(f"{path.name}: header length {length} does not fit a {size}-byte file")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HeaderError(f"{path.name}: header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise HeaderError(f"{path.name}: header is not a JSON object")
    return header


@dataclass(frozen=True)
class TensorSummary:
    count: int
    nbytes: int
    dtypes: dict[str, int]
    """dtype -> number of tensors."""

    def describe(self) -> str:
        kinds = ", ".join(f"{n} {dtype}" for dtype, n in sorted(self.dtypes.items()))
        return f"{self.count} tensors ({kinds})" if self.count else "0 tensors"


def summarize_tensors(path: Path) -> TensorSummary:
    """Tensor count, data bytes and dtypes of a safetensors file, from its header alone."""
    tensors = {k: v for k, v in read_header(path).items() if k != "__metadata__"}
    nbytes = sum(int(t["data_offsets"][1]) - int(t["data_offsets"][0]) for t in tensors.values())
    dtypes = Counter(str(t["dtype"]) for t in tensors.values())
    return TensorSummary(count=len(tensors), nbytes=nbytes, dtypes=dict(dtypes))
