"""What a safetensors file holds, from its header alone (no torch, no numpy).

The header is read and checked against the file size by `lr_config.st_format.read_header`,
the reader lr-checkpoint's loaders, inspect and verify use too: a truncated or damaged file
is the same `CheckpointError` here as there. Only the header is read, so this is instant
even for a multi-GB file.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from lr_config.st_format import read_header

__all__ = ["TensorSummary", "summarize_tensors"]


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
    """Tensor count, data bytes and dtypes of a safetensors file, from its header alone;
    `CheckpointError` naming the file when it is not a complete safetensors file."""
    tensors = read_header(path).tensors.values()
    dtypes = Counter(entry.code for entry in tensors)
    return TensorSummary(count=len(tensors), nbytes=sum(entry.end - entry.begin for entry in tensors), dtypes=dict(dtypes))
