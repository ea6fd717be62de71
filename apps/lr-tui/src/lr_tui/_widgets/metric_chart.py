"""A labelled sparkline of one metric, downsampled to the width it has."""

from __future__ import annotations

from collections.abc import Sequence

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.events import Resize
from textual.widgets import Label, Sparkline

from .._series import downsample, format_value

__all__ = ["MetricChart"]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


class MetricChart(Vertical):
    def __init__(self, metric: str) -> None:
        super().__init__(id=f"chart-{metric}", classes="metric-chart")
        self.metric = metric
        self.values: list[float] = []

    def compose(self) -> ComposeResult:
        yield Label(self.metric, classes="chart-label", markup=False)
        yield Sparkline([], summary_function=_mean, classes="chart-spark")

    def set_values(self, values: list[float]) -> None:
        self.values = values
        self._redraw()

    def on_resize(self, event: Resize) -> None:
        self._redraw()

    def on_mount(self) -> None:
        self._redraw()

    def _redraw(self) -> None:
        sparks = self.query(Sparkline)
        if not sparks:  # values can arrive before the children are mounted
            return
        spark = sparks.first()
        spark.data = downsample(self.values, spark.size.width or 1)
        label = self.metric
        if self.values:
            low, high = min(self.values), max(self.values)
            label += f"  {format_value(self.values[-1])}   min {format_value(low)}  max {format_value(high)}"
        self.query_one(Label).update(label)
