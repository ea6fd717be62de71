"""Cast raw tensor bytes between floating dtypes with numpy, bit for bit as torch does on CPU.

The converter exports fp32 checkpoints as bf16 or fp16 without importing torch (its
import alone is 3 s and 600 MB). numpy has float64, float32 and float16, all rounded to
nearest-even like torch's CPU kernels; bfloat16 is handled as its 16 bits: widening is a
shift, narrowing from float32 rounds to nearest-even with torch's bias trick. A float64
source goes through float32 first, as torch's conversions to float16 and bfloat16 do.
Every value comes out bit for bit as torch's, except NaN payloads: a NaN stays a quiet NaN,
but its other bits are not promised (torch's own scalar and vectorized CPU paths disagree
on them). `tests/test_cast.py` checks every pair against torch, edge values included.
"""

from __future__ import annotations

import numpy as np

__all__ = ["FLOATING", "cast_into"]

FLOATING = ("float64", "float32", "float16", "bfloat16")
_NUMPY = {"float64": np.float64, "float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


def _as_float32(raw: memoryview, source: str) -> np.ndarray:
    values = np.frombuffer(raw, dtype=_NUMPY[source])
    if source == "bfloat16":
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values if source == "float32" else values.astype(np.float32)


def _bfloat16_bits(values: np.ndarray) -> np.ndarray:
    bits = values.view(np.uint32)
    rounded = bits >> 16
    rounded &= 1
    rounded += 0x7FFF
    rounded += bits
    rounded >>= 16
    out = rounded.astype(np.uint16)
    out[np.isnan(values)] = 0xFFFF
    return out


def cast_into(raw: memoryview, source: str, target: str, out: memoryview) -> None:
    """Write the elements of `raw` (dtype `source`) into `out` as dtype `target`; both are
    floating dtype names of `FLOATING`, and `out` holds exactly as many elements."""
    if source == "float64" and target == "float64":
        np.frombuffer(out, dtype=np.float64)[:] = np.frombuffer(raw, dtype=np.float64)
        return
    values = _as_float32(raw, source)
    dest = np.frombuffer(out, dtype=_NUMPY[target])
    if target == "bfloat16":
        dest[:] = _bfloat16_bits(values)
        return
    with np.errstate(over="ignore", invalid="ignore"):  # out of range -> inf, as torch
        np.copyto(dest, values, casting="unsafe")
    if target == "float16":
        dest.view(np.uint16)[np.isnan(values)] |= 0x0200  # numpy keeps a signalling NaN signalling
