"""Numbers for display: downsampling a series to a width, and short human formats."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["downsample", "format_bytes", "format_duration", "format_value"]


def downsample(values: Sequence[float], width: int) -> list[float]:
    """At most `width` points: the mean of each of `width` equal spans of `values`."""
    n = len(values)
    if width <= 0 or n == 0:
        return []
    if n <= width:
        return list(values)
    out: list[float] = []
    for i in range(width):
        span = values[i * n // width : (i + 1) * n // width]
        out.append(sum(span) / len(span))
    return out


def format_value(value: float) -> str:
    """Compact and stable: 4 significant digits, scientific when tiny or huge."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if math.isnan(value) or math.isinf(value):
        return str(value)
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
        return f"{value:.3e}"
    return f"{value:.4g}"


def format_bytes(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KB", "MB", "GB", "TB"):
        value /= 1024
        if value < 1024 or unit == "TB":
            break
    return f"{value:.1f} {unit}"


def format_duration(seconds: float) -> str:
    """`1h02m`, `3m07s`, `42s`."""
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
