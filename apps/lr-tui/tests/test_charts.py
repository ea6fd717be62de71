"""The Monitor's charts: what they draw (`_chart_data`), the compared runs' reads, and by Pilot
the log scale (y), the zoom (z), runs marked for comparison (c) and the evaluations' chart."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from tui_support import app_ready, charts_drawn, evaluated, make_run, metrics_line, metrics_record, notices, wait_until, write_metrics, write_records

from lr_tui._app import LrApp
from lr_tui._chart_data import RunColumns, Series, linear_ticks, log_ticks, prepare, spaced, tick_label
from lr_tui._keymap import APP_BINDINGS, HELP, MONITOR_BINDINGS
from lr_tui._metrics_tail import MetricsTails
from lr_tui._views.monitor import MonitorView
from lr_tui._widgets.metric_chart import MetricChart

SIZE = (100, 30)


# --- what a chart draws -----------------------------------------------------------------------


def test_prepare_leaves_out_what_cannot_be_drawn_and_says_how_much():
    series = Series("a", [1, 2, 3, 4, 5], [1.0, math.nan, math.inf, 0.0, -2.0])
    linear = prepare([series], width=80)
    assert linear.series == [Series("a", [1, 4, 5], [1.0, 0.0, -2.0])] and (linear.not_finite, linear.not_positive) == (2, 0)
    log = prepare([series], width=80, log=True)
    assert log.series == [Series("a", [1], [1.0])] and (log.not_finite, log.not_positive) == (2, 2)


def test_prepare_zooms_on_the_last_steps_of_every_series_and_downsamples_to_the_width():
    long, short = Series("long", list(range(0, 1001)), [1.0] * 1001), Series("short", [10, 950], [2.0, 3.0])
    zoomed = prepare([long, short], width=500, last_steps=100)
    assert zoomed.series[0].steps == list(range(900, 1001)) and zoomed.series[1].steps == [950]
    wide = prepare([long], width=37)
    assert len(wide.series[0].steps) == len(wide.series[0].values) == 37


def test_prepare_copes_with_no_records_and_one():
    assert prepare([], width=10).points == [] and prepare([Series("a", [], [])], width=10).points == []
    assert prepare([Series("a", [7], [0.5])], width=10, log=True, last_steps=100).points == [(7, 0.5)]


def test_run_columns_grow_with_the_records_and_prepare_redoes_only_what_changed():
    columns = RunColumns(("loss",), [metrics_record(10), evaluated(20, 0.5)])
    assert columns.series("a", "loss") == Series("a", [10, 20], [metrics_record(10).loss, metrics_record(20).loss])
    assert columns.eval_series("a") == Series("a", [20], [0.5])
    other = RunColumns(("loss",), [metrics_record(10)])
    cache: dict = {}
    prepare([columns.series("a", "loss"), other.series("b", "loss")], width=80, cache=cache)
    drawn_b = cache[(other.series("b", "loss").version, 80, False, None)]
    columns.extend([metrics_record(30)])
    again = prepare([columns.series("a", "loss"), other.series("b", "loss")], width=80, cache=cache)
    assert again.series[0].steps == [10, 20, 30] and len(cache) == 2
    assert cache[(other.series("b", "loss").version, 80, False, None)] is drawn_b  # b unchanged: not prepared again


def test_ticks_are_round_values_inside_the_range_with_short_labels_two_rows_apart():
    assert linear_ticks(330, 369.4, 3) == [340, 360]
    assert linear_ticks(0, 1, 4) == [0, 0.25, 0.5, 0.75, 1]
    assert linear_ticks(5, 5, 3) == [5]
    assert log_ticks(0.01, 20, 4) == [0.01, 0.1, 1, 10]
    assert log_ticks(0.15, 1.8, 3) == [0.2, 0.5, 1]
    assert [tick_label(v) for v in (0, 0.25, 350, 2500, 1.5e6, 5e-4, 2.5e-5)] == ["0", "0.25", "350", "2.5k", "1.5M", "5e-04", "2.5e-05"]
    assert spaced([1, 2, 3, 4, 5], 1, 5, rows=5) == [1, 3, 5]
    assert spaced([2, 4], 0.5, 5.4, rows=3) == [0.5, 5.4]  # both on the middle row: the ends instead
    assert spaced([0.2, 0.5, 1], 0.15, 2, rows=5, at=math.log10) == [0.2, 0.5]  # 1 is a row above 0.5


def test_metrics_tails_read_each_run_from_its_start_and_forget_the_ones_dropped(tmp_path):
    write_metrics(tmp_path / "a" / "metrics.jsonl", [5, 10])
    (tmp_path / "b").mkdir()
    tails = MetricsTails()
    first = tails.read([(("a", 0), tmp_path / "a"), (("b", 1), tmp_path / "b")])
    assert [r.step for r in first[("a", 0)].records] == [5, 10] and first[("b", 1)].records == []
    assert tails.read([(("a", 0), tmp_path / "a")]) == {}  # nothing new; b dropped
    with (tmp_path / "a" / "metrics.jsonl").open("a") as f:
        f.write(metrics_line(15))
    assert [r.step for r in tails.read([(("a", 0), tmp_path / "a")])[("a", 0)].records] == [15]
    again = tails.read([(("a", 2), tmp_path / "a")])  # marked again: from the start
    assert [r.step for r in again[("a", 2)].records] == [5, 10, 15]


def test_the_chart_keys_are_in_the_help_and_clash_with_no_other_key():
    monitor_keys = [b.key for b in MONITOR_BINDINGS]
    app_keys = {key for b in APP_BINDINGS for key in b.key.split(",")}
    assert {"c", "z", "y"} <= set(monitor_keys) and len(set(monitor_keys)) == len(monitor_keys) and not app_keys & set(monitor_keys)
    rows = dict(dict(HELP)["Monitor"])
    assert "compare" in rows["c"] and "1000" in rows["z"] and "log" in rows["y"]


# --- in the app ---------------------------------------------------------------------------------


def chart(monitor: MonitorView, metric: str) -> MetricChart:
    return monitor.query_one(f"#chart-{metric}", MetricChart)


def title(monitor: MonitorView, metric: str) -> str:
    return str(chart(monitor, metric).query_one(".chart-label").render())


async def watching(pilot, records: int) -> MonitorView:  # type: ignore[no-untyped-def]
    await app_ready(pilot)
    monitor: MonitorView = pilot.app.monitor_view
    await wait_until(pilot, lambda: len(monitor.records) == records and charts_drawn(pilot.app), what=f"{records} records charted")
    return monitor


@pytest.mark.asyncio
async def test_y_toggles_the_loss_chart_between_log_and_linear_and_the_title_says_what_is_left_out(tmp_path):
    bad = [replace(metrics_record(step), loss=loss) for step, loss in ((30, math.nan), (40, math.inf), (50, 0.0), (60, -1.0))]
    write_records(tmp_path / "metrics.jsonl", [metrics_record(10), metrics_record(20), *bad, metrics_record(70)])
    app = LrApp(tmp_path, plan_runner=None, poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        monitor = await watching(pilot, 7)
        loss = chart(monitor, "loss")
        assert loss.y_scale == "log" and loss.prepared.points == [(10, metrics_record(10).loss), (20, metrics_record(20).loss), (70, metrics_record(70).loss)]
        assert title(monitor, "loss").endswith("· log y · all steps · not drawn: 2 NaN/inf, 2 <=0 on log")
        log_ticks_shown = loss.y_ticks
        await pilot.press("y")
        assert loss.y_scale == "linear" and [x for x, _ in loss.prepared.points] == [10, 20, 50, 60, 70]
        assert title(monitor, "loss").endswith("· linear y · all steps · not drawn: 2 NaN/inf")
        assert loss.y_ticks != log_ticks_shown and "-1" in loss.y_ticks  # the ticks reach -1 now
        assert chart(monitor, "lr").y_scale == "linear" and "y ·" not in title(monitor, "lr")
        await pilot.press("y")
        assert loss.y_scale == "log" and loss.y_ticks == log_ticks_shown


@pytest.mark.asyncio
async def test_z_zooms_every_chart_to_the_last_1000_then_100_steps(tmp_path):
    write_metrics(tmp_path / "metrics.jsonl", list(range(20, 2001, 20)))
    app = LrApp(tmp_path, plan_runner=None, poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        monitor = await watching(pilot, 100)
        first_steps = {}
        for label in ("all steps", "last 1000 steps", "last 100 steps", "all steps"):
            for metric in ("loss", "samples_per_s"):
                assert f"· {label}" in title(monitor, metric)
            first_steps[label] = chart(monitor, "lr").prepared.points[0][0]
            await pilot.press("z")
        assert first_steps == {"all steps": 20, "last 1000 steps": 1000, "last 100 steps": 1900}
        assert chart(monitor, "lr").x_ticks[-1] == "2k"
        charts = monitor.query_one("#charts")
        await pilot.press("tab", "down", "z")  # the charts scroll when focused; their keys work there too
        assert app.focused is charts and charts.scroll_y > 0 and "· last 100 steps" in title(monitor, "lr")


@pytest.mark.asyncio
async def test_no_records_then_one(tmp_path):
    app = LrApp(tmp_path, plan_runner=None, poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        monitor = await watching(pilot, 0)
        assert title(monitor, "loss") == "loss · log y · all steps · no records yet" and chart(monitor, "loss").y_ticks == []
        write_metrics(tmp_path / "metrics.jsonl", [10])
        await wait_until(pilot, lambda: len(monitor.records) == 1, what="the record")
        grad = chart(monitor, "grad_norm")
        assert grad.prepared.points == [(10, metrics_record(10).grad_norm)] and grad.x_ticks == ["10"] and len(grad.y_ticks) == 1


@pytest.mark.asyncio
async def test_the_eval_chart_shows_only_once_a_run_has_evaluations(tmp_path):
    write_metrics(tmp_path / "metrics.jsonl", [10, 20])
    app = LrApp(tmp_path, plan_runner=None, poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        monitor = await watching(pilot, 2)
        eval_chart = chart(monitor, "eval")
        assert not eval_chart.display
        write_records(tmp_path / "metrics.jsonl", [evaluated(30, 0.2), metrics_record(40), evaluated(50, 0.45)], append=True)
        await wait_until(pilot, lambda: len(monitor.records) == 5 and charts_drawn(app), what="the evaluations charted")
        assert eval_chart.display and eval_chart.prepared.points == [(30, 0.2), (50, 0.45)]
        assert eval_chart.y_ticks == ["0%", "100%"]  # y from 0 to 1 whatever the rates
        assert title(monitor, "eval") == "eval success 45.0% · all steps"


def runs_under(root: Path, count: int) -> LrApp:
    """An app listing `count` runs under `root`: run_0 the newest (the first row), run_i logged
    every 10 steps up to step 10 * (i + 2)."""
    for i in range(count):
        make_run(root / f"run_{i}", started=f"2026-01-{20 - i:02d}T00:00:00", step=10 * (i + 2))
    return LrApp(plan_runner=None, runs=[root], list_interval=0.05, poll_interval=0.05)


async def listed(pilot, count: int) -> MonitorView:  # type: ignore[no-untyped-def]
    await app_ready(pilot)
    await pilot.press("2")
    monitor: MonitorView = pilot.app.monitor_view
    await wait_until(pilot, lambda: monitor.query_one("#runs").row_count == count and charts_drawn(pilot.app), what=f"{count} runs")
    return monitor


@pytest.mark.asyncio
async def test_two_runs_marked_in_the_list_are_drawn_together_with_a_legend(tmp_path):
    root = tmp_path / "runs"
    app = runs_under(root, 2)
    async with app.run_test(size=SIZE) as pilot:
        monitor = await listed(pilot, 2)
        await pilot.press("c", "down", "c")
        await wait_until(pilot, lambda: len(monitor.compared_columns.get(root / "run_1", ())) == 3, what="run_1's metrics")
        loss = chart(monitor, "loss")
        assert loss.names == ["run_0", "run_1"] and [list(s.steps) for s in loss.prepared.series] == [[10, 20], [10, 20, 30]]
        assert str(monitor.query_one("#chart-legend").render()) == "━━ run_0  ━━ run_1"
        runs = monitor.query_one("#runs")
        assert [runs.get_row_at(i)[0] for i in range(2)] == ["● run_0", "● run_1"]
        await pilot.press("enter")  # watch run_1 too: drawn once, first
        await wait_until(pilot, lambda: len(monitor.records) == 3, what="the watched run")
        assert loss.names == ["run_1", "run_0"]
        await pilot.press("c")  # unmark it: still watched
        assert loss.names == ["run_1", "run_0"] and monitor.compared_runs == [root / "run_0"]
        await pilot.press("up", "c")
        assert loss.names == ["run_1"] and not monitor.query_one("#chart-legend").display


@pytest.mark.asyncio
async def test_a_fifth_run_is_not_marked(tmp_path):
    app = runs_under(tmp_path / "runs", 5)
    async with app.run_test(size=SIZE) as pilot:
        monitor = await listed(pilot, 5)
        await pilot.press("c", "down", "c", "down", "c", "down", "c", "down", "c")
        assert len(monitor.compared) == 4 and tmp_path / "runs" / "run_4" not in monitor.compared_runs
        assert notices(pilot.app, "warning") == ["Compare 4 runs at most: unmark one first (c on its row)."]


@pytest.mark.asyncio
async def test_quitting_before_a_deferred_widget_is_built_builds_nothing_and_raises_nothing():
    """`q` pressed as the app opens: the placeholders' callbacks run while the app tears down."""
    from textual.app import App, ComposeResult
    from textual.containers import Vertical
    from textual.widgets import Static

    from lr_tui._widgets.deferred import Deferred

    built: list[str] = []

    def build() -> Static:
        built.append("built")
        return Static("late")

    class Quits(App[None]):
        def compose(self) -> ComposeResult:
            with Vertical():
                yield Deferred(build)

        def on_mount(self) -> None:
            self.exit()

    app = Quits()
    async with app.run_test() as pilot:
        await pilot.pause()
    assert app.return_code == 0 and built == []
