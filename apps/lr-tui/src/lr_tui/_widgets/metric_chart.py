"""A line chart of one metric: a line per run (the order gives the colours, `RUN_COLORS`), the
step on x, the metric on y (log or linear), cut to the last N steps, under a one-line title
that says what is shown and what could not be drawn.

The lines are drawn by textual-plotext's `PlotextPlot`; its module (~0.2 s to import) loads
when the chart's `Deferred` placeholder builds it, after the first frame. What is plotted is
computed without it (`_chart_data.prepare`), so the title and `prepared` are right before it."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from itertools import cycle
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.events import Resize
from textual.widget import Widget
from textual.widgets import Label

from .._chart_data import Drawn, Prepared, Series, linear_ticks, log_ticks, percent_label, prepare, spaced, tick_label
from .deferred import Deferred

if TYPE_CHECKING:
    from textual_plotext import Plot, PlotextPlot

__all__ = ["RUN_COLORS", "ChartStack", "MetricChart", "legend"]

RGB = tuple[int, int, int]
RUN_COLORS: tuple[RGB, ...] = ((0, 130, 200), (230, 25, 75), (60, 180, 75), (245, 130, 48), (145, 30, 180))
"""The line of each run, in the order the charts get them: blue, red, green, orange, purple."""


def legend(names: Sequence[str]) -> Text:
    """`━ name` for each run, in its line's colour."""
    text = Text()
    for name, (r, g, b) in zip(names, cycle(RUN_COLORS)):
        text.append("━━ ", style=f"bold rgb({r},{g},{b})")
        text.append(f"{name}  ")
    text.rstrip()
    return text


def zoom_text(last_steps: int | None) -> str:
    return "all steps" if last_steps is None else f"last {last_steps} steps"


class MetricChart(Vertical):
    """`show(series, ...)` draws the runs' series; `prepared` is what it draws."""

    def __init__(self, metric: str, *, name: str | None = None, log_toggle: bool = False, percent: bool = False) -> None:
        """`name`: in the title (else `metric`); `log_toggle`: the title says which scale y has
        (the Monitor toggles it); `percent`: y is a rate from 0 to 1, labelled in %."""
        super().__init__(id=f"chart-{metric}", classes="metric-chart")
        self.metric = metric
        self.chart_name = name or metric
        self.log_toggle = log_toggle
        self.percent = percent
        self.series: list[Series] = []
        self.log_scale = False
        self.last_steps: int | None = None
        self.latest = ""
        self.prepared = Prepared([])
        self.x_ticks: list[str] = []
        self.y_ticks: list[str] = []
        self.plot: PlotextPlot | None = None
        self._prepared_for: object = None
        self._drawn: dict[Hashable, Drawn] = {}  # each series as prepared last
        self._plotted_for: object = None

    def compose(self) -> ComposeResult:
        yield Label(self.chart_name, classes="chart-label", markup=False)
        yield Deferred(self._make_plot)

    def _make_plot(self) -> Widget:
        from textual_plotext import PlotextPlot

        self.plot = PlotextPlot(classes="chart-plot")
        self._redraw()
        return self.plot

    def show(self, series: Sequence[Series], *, log_scale: bool = False, last_steps: int | None = None, latest: str = "") -> None:
        """Draw `series` (one per run), y on a log scale or not, the last `last_steps` steps
        (None: all); `latest`: the watched run's latest value, for the title."""
        self.series, self.log_scale, self.last_steps, self.latest = list(series), log_scale, last_steps, latest
        self._redraw()

    @property
    def y_scale(self) -> str:
        return "log" if self.log_scale else "linear"

    @property
    def names(self) -> list[str]:
        """The runs drawn, in the order of their colours."""
        return [s.name for s in self.prepared.series]

    @property
    def title(self) -> str:
        parts = [f"{self.chart_name} {self.latest}".rstrip()]
        if self.log_toggle:
            parts.append(f"{self.y_scale} y")
        parts.append(zoom_text(self.last_steps))
        if not self.prepared.points:
            parts.append("no records yet" if not any(s.steps for s in self.series) else "nothing to draw")
        skipped = [f"{n} {what}" for n, what in ((self.prepared.not_finite, "NaN/inf"), (self.prepared.not_positive, "<=0 on log"))
                   if n]
        if skipped:
            parts.append("not drawn: " + ", ".join(skipped))
        return " · ".join(parts)

    def on_resize(self, event: Resize) -> None:
        self._redraw()

    def _redraw(self) -> None:
        width, height = self.content_size
        key = ([s.version for s in self.series], self.log_scale, self.last_steps, width, height)
        if key != self._prepared_for:
            self._prepared_for = key
            self.prepared = prepare(self.series, width=max(1, width), log=self.log_scale, last_steps=self.last_steps, cache=self._drawn)
            labels = self.query(".chart-label")
            if labels:  # the title can come before the children mount
                labels.first(Label).update(self.title)
        if self.plot is not None and key != self._plotted_for:
            self._plotted_for = key
            self._plot(self.plot, width, max(1, height - 1))

    def _plot(self, plot: PlotextPlot, width: int, height: int) -> None:
        plt = plot.plt
        plt.clear_figure()
        for series, color in zip(self.prepared.series, cycle(RUN_COLORS)):
            if series.steps:
                plt.plot(list(series.steps), self._y(series.values), marker="braille", color=color)
        plt.xaxes(True, False)
        plt.yaxes(True, False)
        plt.xlabel("step")
        plt.ylabel(self.metric)
        points = self.prepared.points
        self.x_ticks = self._x_axis(plt, [x for x, _ in points], width) if points else []
        self.y_ticks = self._y_axis(plt, [y for _, y in points], height) if points else []
        plot.refresh()

    def _x_axis(self, plt: Plot, steps: list[float], width: int) -> list[str]:
        low, high = min(steps), max(steps)
        if low < high:
            plt.xlim(low, high)
        ticks = [t for t in linear_ticks(low, high, max(2, width // 10)) if t == int(t)] or [low]
        return _set_ticks(plt.xticks, ticks, tick_label)

    def _y_axis(self, plt: Plot, values: list[float], height: int) -> list[str]:
        rows = height - 2  # under the lines: the step ticks, the axes' labels
        gaps = max(1, (rows - 1) // 2)  # a label every other row at most
        if self.percent:
            plt.ylim(0, 1)
            return _set_ticks(plt.yticks, spaced(linear_ticks(0, 1, min(gaps, 4)), 0, 1, rows), percent_label)
        low, high = min(values), max(values)
        if self.log_scale:
            ticks = spaced(log_ticks(low, high, gaps + 1), low, high, rows, at=math.log10)
        else:
            ticks = spaced(linear_ticks(low, high, gaps), low, high, rows)
        return _set_ticks(plt.yticks, ticks, tick_label, at=self._y)

    def _y(self, values: Sequence[float]) -> list[float]:
        """Where `values` go on y: their log10 on a log scale. (Plotext's own log scale takes the
        log of its data in place at each build, and the widget builds at each render.)"""
        return [math.log10(v) for v in values] if self.log_scale else list(values)


def _set_ticks(set_them: Callable[..., None], ticks: list[float], label: Callable[[float], str],
               at: Callable[[list[float]], list[float]] = list) -> list[str]:
    labels = [label(t) for t in ticks]
    set_them(at(ticks), labels)
    return labels


class ChartStack(VerticalScroll):
    """The charts shown, one above the other: as many as fit with `MIN_ROWS` rows each share
    the height equally (all four at 120x40, two at 80x24), and the rest scroll into view."""

    MIN_ROWS = 7
    """A title, four rows of lines, the step ticks, the axes' labels."""

    def on_resize(self, event: Resize) -> None:
        self.fit()

    def fit(self) -> None:
        """Size the charts to the height (again after one is shown or hidden)."""
        charts = [chart for chart in self.query(MetricChart) if chart.display]
        height = self.scrollable_content_region.height
        if not charts or not height:
            return
        shown = max(1, min(len(charts), height // self.MIN_ROWS))
        rows = max(self.MIN_ROWS, height // shown)
        for chart in charts:
            chart.styles.height = rows
