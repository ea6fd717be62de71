"""What a Monitor chart draws, without Textual: each run's (step, value) series of one metric,
cut to the last N steps, cleaned of what cannot be drawn (NaN and inf; values <= 0 on a log
scale), downsampled to the chart's width, and the axes' ticks with short labels.

A run's metrics are kept as columns (`RunColumns`), appended to as its records arrive, so a
redraw takes no pass over the records; `prepare` checks a whole column at C speed (`sum`,
`min`) and sorts out the points one by one only when one cannot be drawn."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from itertools import compress

from lr_config import MetricsRecord

from ._series import downsample

__all__ = [
    "Drawn",
    "Prepared",
    "RunColumns",
    "Series",
    "linear_ticks",
    "log_ticks",
    "percent_label",
    "prepare",
    "spaced",
    "tick_label",
]


@dataclass(frozen=True)
class Series:
    """One run's line: `values[i]` at step `steps[i]`."""

    name: str
    steps: Sequence[float]
    values: Sequence[float]

    @property
    def version(self) -> tuple[str, int, int, int]:
        """Changes when the series does, for columns that are only appended to (`RunColumns`)."""
        return self.name, id(self.steps), id(self.values), len(self.values)


@dataclass(frozen=True)
class Prepared:
    """What to draw, and how many points of the shown steps could not be drawn."""

    series: list[Series]
    not_finite: int = 0
    not_positive: int = 0
    """Values <= 0 left out of a log scale."""

    @property
    def points(self) -> list[tuple[float, float]]:
        return [p for s in self.series for p in zip(s.steps, s.values)]


class RunColumns:
    """One run's steps, each of `metrics` (float fields of `MetricsRecord`) and its --eval_freq
    success rates (0..1), appended to as its records arrive."""

    def __init__(self, metrics: Sequence[str], records: Sequence[MetricsRecord] = ()) -> None:
        self.steps: list[float] = []
        self.values: dict[str, list[float]] = {metric: [] for metric in metrics}
        self.eval_steps: list[float] = []
        self.eval_rates: list[float] = []
        self.extend(records)

    def __len__(self) -> int:
        return len(self.steps)

    def extend(self, records: Sequence[MetricsRecord]) -> None:
        self.steps += [r.step for r in records]
        for metric, values in self.values.items():
            values += [float(getattr(r, metric)) for r in records]
        evaluated = [(r.step, r.eval.success_rate) for r in records if r.eval is not None]
        self.eval_steps += [step for step, _ in evaluated]
        self.eval_rates += [rate for _, rate in evaluated]

    def series(self, name: str, metric: str) -> Series:
        return Series(name, self.steps, self.values[metric])

    def eval_series(self, name: str) -> Series:
        return Series(name, self.eval_steps, self.eval_rates)


Drawn = tuple[Series, int, int]
"""A series as drawn, how many of its values were not finite, how many not positive (on log)."""


def prepare(series: Sequence[Series], *, width: int, log: bool = False, last_steps: int | None = None,
            cache: dict[Hashable, Drawn] | None = None) -> Prepared:
    """Each series cut to the last `last_steps` steps (of all the series: they share the x axis),
    without NaN, inf and (with `log`) values <= 0, at most `width` points (`downsample`).
    `cache`: the series prepared last time (by their `version`), and after, this time's."""
    end = max((s.steps[-1] for s in series if s.steps), default=0.0)
    start = end - last_steps if last_steps is not None else None
    old = dict(cache or {})
    now: dict[Hashable, Drawn] = {}
    for s in series:
        key = (s.version, width, log, start)
        now[key] = now.get(key) or old.get(key) or _prepare_one(s, width, log, start)
    if cache is not None:
        cache.clear()
        cache.update(now)
    drawn = [now[(s.version, width, log, start)] for s in series]
    return Prepared([d[0] for d in drawn], sum(d[1] for d in drawn), sum(d[2] for d in drawn))


def _prepare_one(series: Series, width: int, log: bool, start: float | None) -> Drawn:
    first = _window_start(series.steps, start) if start is not None else 0
    steps, values, not_finite, not_positive = _drawable(series.steps[first:], series.values[first:], log)
    return Series(series.name, downsample(steps, width), downsample(values, width)), not_finite, not_positive


def _window_start(steps: Sequence[float], start: float) -> int:
    """Where the steps from `start` on begin, counted back from the end (a step before `start`,
    even with later ones before it, ends the window)."""
    first = len(steps)
    while first > 0 and steps[first - 1] >= start:
        first -= 1
    return first


def _drawable(steps: Sequence[float], values: Sequence[float], log: bool) -> tuple[Sequence[float], Sequence[float], int, int]:
    """(steps, values) without NaN, inf and (`log`) values <= 0, how many were not finite and
    how many not positive. A finite sum means every value is finite (a NaN or inf makes it one).
    (`map` and `compress`: each value is looked at in C.)"""
    if not values or (math.isfinite(sum(values)) and (not log or min(values) > 0)):
        return steps, values, 0, 0
    finite = list(map(math.isfinite, values))
    kept = list(map(operator.and_, finite, map((0.0).__lt__, values))) if log else finite
    n_finite, n_kept = sum(finite), sum(kept)
    return list(compress(steps, kept)), list(compress(values, kept)), len(values) - n_finite, n_finite - n_kept


def _nice_step(span: float, count: int) -> float:
    raw = span / max(1, count)
    magnitude = 10.0 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)


def linear_ticks(low: float, high: float, count: int) -> list[float]:
    """About `count` round values from `low` to `high` (both included in the range); one value
    when the range is a point."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return [low]
    step = _nice_step(high - low, count)
    first = math.ceil(low / step - 1e-9)
    last = math.floor(high / step + 1e-9)
    return [round(i * step, 12) for i in range(first, last + 1)]


def log_ticks(low: float, high: float, count: int) -> list[float]:
    """At most `count` values for a log axis from `low` to `high` (> 0): powers of ten, else
    1-2-5 of each decade, else 1..9 of each decade, else `linear_ticks`."""
    if low <= 0 or high <= low:
        return linear_ticks(low, high, count)
    decades = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
    for mantissas in ((1,), (1, 2, 5), tuple(range(1, 10))):
        ticks = [m * 10.0**d for d in decades for m in mantissas if low <= m * 10.0**d <= high]
        if len(ticks) >= 2:
            every = math.ceil(len(ticks) / max(1, count))
            return ticks[::every]
    return linear_ticks(low, high, count)


def spaced(ticks: Sequence[float], low: float, high: float, rows: int, at: Callable[[float], float] = float) -> list[float]:
    """The `ticks` that fall two rows apart or more on an axis of `rows` rows from `low` to
    `high` (a row's label above the next one's is hard to read, and two on one row hide each
    other); the axis ends themselves when fewer than two do. `at`: where a value goes on the
    axis (`math.log10` on a log scale)."""
    start, end = at(low), at(high)
    if end <= start or rows < 2:
        return list(ticks[:1])
    kept: list[float] = []
    last_row = -2
    for tick in ticks:
        row = round((at(tick) - start) / (end - start) * (rows - 1))
        if row - last_row >= 2:
            kept.append(tick)
            last_row = row
    return kept if len(kept) >= 2 else [low, high]


def tick_label(value: float) -> str:
    """Short: `0.25`, `350`, `2.5k`, `1.2M`, `5e-04`, `2.5e-05`."""
    size = abs(value)
    if size == 0:
        return "0"
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if size >= limit:
            return f"{value / limit:.3g}{suffix}"
    if size >= 1e-3:
        return f"{value:.3g}"
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa.removesuffix('.0')}e{exponent}"


def percent_label(value: float) -> str:
    """A rate of 0..1 as `50%`."""
    return f"{100 * value:.0f}%"
