"""Snapshots of each view at 100x30 (and Launch at 80x24, where the footer must fit, also with a
focused field, and at 120x40 with a local video dataset chosen), the help and the resume screen, on the checked-in sample run; the Monitor's
list of the runs found under `outputs/train` at 80x24 and 120x40, and its charts comparing two
runs at 80x24 and at 120x40 (with evaluations, zoomed) (run folders written in a temporary
folder, with fixed times and metrics).

The sample folder (`sample_run/`, made by `tui_support.build_sample_run`) is opened by a
relative path from this folder, the plan comes from a fixed stand-in, and the launchers'
paths (`cli_tasks.resolve_executable`: this environment's `torchrun`) are a fixed one, so
nothing in the pictures depends on the clock, the checkout path or the engine. The Logs view shows
the captured log of a run whose rank 1 was SIGKILLed (`data/killed_rank.log`), in a run
folder made in a temporary folder; the Hardware view a fixed source (`FixedHardware`).
Update with `pytest apps/lr-tui/tests/test_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from tui_support import (
    GONE_PID,
    FixedHardware,
    app_ready,
    charts_drawn,
    evaluated,
    make_run,
    metrics_record,
    sample_planner,
    tables_settled,
    wait_until,
    write_records,
    write_run_status,
)

from textual.widgets._footer import FooterKey

from lr_config import MetricsRecord
from lr_tui import _cli_tasks as cli_tasks
from lr_tui import _run_info as run_info
from lr_tui._app import LrApp
from lr_tui._screens.resume import ResumeScreen
from lr_tui._views.monitor import MonitorView

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def _in_tests_folder(monkeypatch):
    monkeypatch.chdir(HERE)
    # The runs here say running on another host with a fixed run.json time: not stale however long ago that is.
    monkeypatch.setattr(run_info, "STALE_AFTER_S", math.inf)
    monkeypatch.setenv("LR_CACHE_DIR", "lr-cache")  # the demo's folder, as the dataset panel names it: not generated
    monkeypatch.setattr(cli_tasks, "resolve_executable", lambda name: f"/opt/lr/.venv/bin/{name}")


def sample_app(run: bool = True) -> LrApp:
    return LrApp(Path("sample_run") if run else None, plan_runner=sample_planner, plan_delay=0.01, poll_interval=0.05)


async def plan_shown(pilot) -> None:  # type: ignore[no-untyped-def]
    await app_ready(pilot)
    await wait_until(pilot, lambda: pilot.app.query_one("#plan").text.startswith("lr-engine dry run"), what="the plan")


def test_launch_view(snap_compare):
    assert snap_compare(sample_app(run=False), terminal_size=(100, 30), run_before=plan_shown)


def test_launch_view_80x24(snap_compare):
    assert snap_compare(sample_app(run=False), terminal_size=(80, 24), run_before=plan_shown)


def test_launch_view_80x24_a_focused_field(snap_compare):
    """The focused field stands out: a bar of colour across it, its label in bold accent."""

    async def run_before(pilot) -> None:  # type: ignore[no-untyped-def]
        await plan_shown(pilot)
        pilot.app.query_one("#field-steps").focus()
        # The footer drops "? Help" (an input takes "?") a refresh or two after the focus moves.
        await wait_until(pilot, lambda: not any(key.key == "question_mark" for key in pilot.app.query(FooterKey)), what="the footer of a focused field")
        await pilot.pause()

    assert snap_compare(sample_app(run=False), terminal_size=(80, 24), run_before=run_before)


def test_launch_view_120x40_a_local_video_dataset(snap_compare):
    """The dataset panel for LeRobot's own video dataset: where, how much, which camera and codec."""

    async def run_before(pilot) -> None:  # type: ignore[no-untyped-def]
        await plan_shown(pilot)
        pilot.app.launch_view.rows["dataset_root"].set_value("../../../packages/lr-engine/tests/data/lerobot_reference/dataset_pointmass_video")
        await wait_until(pilot, lambda: "local folder" in str(pilot.app.query_one("#dataset-info").render()), what="the dataset panel")
        await pilot.pause()

    assert snap_compare(sample_app(run=False), terminal_size=(120, 40), run_before=run_before)


def test_launch_view_invalid_topology(snap_compare):
    async def run_before(pilot) -> None:  # type: ignore[no-untyped-def]
        await app_ready(pilot)
        rows = pilot.app.launch_view.rows
        rows["nproc_per_node"].set_value("4")
        rows["dp_shard"].set_value("3")
        await pilot.pause()
        pilot.app.query_one("#launch-form").scroll_to(y=6, animate=False)
        await pilot.pause()

    assert snap_compare(sample_app(run=False), terminal_size=(100, 30), run_before=run_before)


def test_monitor_view(snap_compare):
    async def run_before(pilot) -> None:  # type: ignore[no-untyped-def]
        await app_ready(pilot)
        await wait_until(pilot, lambda: len(pilot.app.monitor_view.records) == 40 and charts_drawn(pilot.app), what="the sample metrics")
        # The poll (every 50 ms here) stops, so no update lands between the settled tables and the snapshot.
        pilot.app.workers.cancel_group(pilot.app.monitor_view, "tail")
        await wait_until(pilot, lambda: all(w.is_finished for w in pilot.app.workers if w.group == "tail"), what="the poll to stop")
        await wait_until(pilot, lambda: tables_settled(pilot.app), what="the tables' column widths")
        await pilot.pause()

    assert snap_compare(sample_app(), terminal_size=(100, 30), run_before=run_before)


def test_checkpoints_view(snap_compare):
    async def run_before(pilot) -> None:  # type: ignore[no-untyped-def]
        await app_ready(pilot)
        await pilot.press("3")
        await pilot.pause()
        await wait_until(pilot, lambda: tables_settled(pilot.app), what="the tables' column widths")

    assert snap_compare(sample_app(), terminal_size=(100, 30), run_before=run_before)


def test_resume_screen_marks_the_fields_its_refusal_asks_for(snap_compare):
    async def run_before(pilot) -> None:  # type: ignore[no-untyped-def]
        await app_ready(pilot)
        await pilot.press("r")
        await wait_until(pilot, lambda: isinstance(pilot.app.screen, ResumeScreen), what="the resume screen")
        pilot.app.screen.query_one("#resume-nproc-per-node").value = "3"  # the saved 1 x 2 does not fit
        await wait_until(pilot, lambda: charts_drawn(pilot.app), what="the charts behind")
        pilot.app.workers.cancel_group(pilot.app.monitor_view, "tail")  # nothing changes behind it
        await wait_until(pilot, lambda: all(w.is_finished for w in pilot.app.workers if w.group == "tail"), what="the poll to stop")
        await pilot.pause()

    assert snap_compare(sample_app(), terminal_size=(100, 30), run_before=run_before)


def test_help_screen(snap_compare):
    async def run_before(pilot) -> None:  # type: ignore[no-untyped-def]
        await app_ready(pilot)
        await pilot.press("question_mark")
        await pilot.pause()

    assert snap_compare(sample_app(run=False), terminal_size=(100, 30), run_before=run_before)


def test_log_view_at_the_first_error_with_a_search(snap_compare, tmp_path, monkeypatch):
    run = tmp_path / "killed_run"
    (run / "logs").mkdir(parents=True)
    shutil.copy(HERE / "data" / "killed_rank.log", run / "logs" / "launch.log")
    write_run_status(run, status="failed", step=10, steps=100000, error="RuntimeError: gloo: Connection closed by peer")
    monkeypatch.chdir(tmp_path)

    async def run_before(pilot) -> None:  # type: ignore[no-untyped-def]
        await app_ready(pilot)
        view = pilot.app.log_view
        await wait_until(pilot, lambda: len(view.events) == 3 and len(view.lines.lines) == 62, what="the log and its events")
        await pilot.press("l")
        await pilot.pause()
        pilot.app.query_one("#log-search").value = "peer"
        await pilot.pause()

    app = LrApp(Path("killed_run"), plan_runner=None, poll_interval=0.05, hardware=FixedHardware())
    assert snap_compare(app, terminal_size=(100, 30), run_before=run_before)


def test_hardware_view(snap_compare):
    async def run_before(pilot) -> None:  # type: ignore[no-untyped-def]
        await app_ready(pilot)
        await pilot.press("5")
        await wait_until(pilot, lambda: pilot.app.hardware_view.samples >= 1, what="a sample")
        await wait_until(pilot, lambda: tables_settled(pilot.app), what="the tables' column widths")
        await pilot.pause()

    app = LrApp(plan_runner=None, hardware=FixedHardware(), hardware_interval=0.05)
    assert snap_compare(app, terminal_size=(100, 30), run_before=run_before)


def found_runs(folder: Path) -> LrApp:
    """Four runs under `folder`/outputs/train, one each: running (on another host: no pid to
    check), stale (its pid is gone on this host), failed and finished; DDP, HSDP, FSDP2, single."""
    import socket

    root = folder / "outputs" / "train"
    make_run(root / "2026-03-04" / "18-30-00_act", started="2026-03-04T18:30:00+00:00", step=200, steps=300,
             flags=("--parallelism.dp_replicate=4",), world_size=4)
    make_run(root / "2026-03-04" / "09-10-00_mlp", started="2026-03-04T09:10:00+00:00", step=70, pid=GONE_PID, hostname=socket.gethostname(),
             flags=("--policy.type=mlp", "--parallelism.dp_replicate=2", "--parallelism.dp_shard=4"), world_size=8)
    make_run(root / "2026-03-02" / "22-00-00_act", started="2026-03-02T22:00:00+00:00", status="failed", step=30, steps=1000,
             flags=("--parallelism.dp_shard=2",), world_size=2)
    make_run(root / "2026-02-27" / "11-45-00_mlp", started="2026-02-27T11:45:00+00:00", status="finished", step=100, steps=100,
             flags=("--policy.type=mlp",))
    return LrApp(plan_runner=None, runs=[Path("outputs") / "train"], list_interval=0.05, poll_interval=0.05, hardware=FixedHardware())


async def runs_listed(pilot, count: int = 4) -> MonitorView:  # type: ignore[no-untyped-def]
    """The Monitor, once its list shows the `count` runs written."""
    await app_ready(pilot)
    await pilot.press("2")
    monitor = pilot.app.monitor_view
    await wait_until(pilot, lambda: monitor.query_one("#runs").row_count == count, what=f"the {count} runs")
    return monitor


async def settled(pilot, monitor: MonitorView) -> None:  # type: ignore[no-untyped-def]
    """Stop the polls, so no update lands between the settled tables and the snapshot."""
    pilot.app.workers.cancel_group(monitor, "tail")
    pilot.app.workers.cancel_group(monitor, "runs")
    await wait_until(pilot, lambda: tables_settled(pilot.app) and charts_drawn(pilot.app), what="the tables' column widths and the charts")
    await wait_until(pilot, lambda: all(w.is_finished for w in pilot.app.workers if w.group in ("tail", "runs")), what="the polls to stop")
    await pilot.pause()


def test_monitor_run_list_80x24(snap_compare, tmp_path, monkeypatch):
    """Nothing watched yet: the runs found, newest first, the first highlighted."""
    monkeypatch.chdir(tmp_path)

    async def run_before(pilot) -> None:  # type: ignore[no-untyped-def]
        await settled(pilot, await runs_listed(pilot))

    assert snap_compare(found_runs(tmp_path), terminal_size=(80, 24), run_before=run_before)


def test_monitor_run_list_120x40_watching_one(snap_compare, tmp_path, monkeypatch):
    """Enter on the newest run watches it: its charts, latest values and processes (on another host)."""
    monkeypatch.chdir(tmp_path)

    async def run_before(pilot) -> None:  # type: ignore[no-untyped-def]
        monitor = await runs_listed(pilot)
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(monitor.records) == 20 and bool(monitor.states), what="the watched run")
        await settled(pilot, monitor)

    assert snap_compare(found_runs(tmp_path), terminal_size=(120, 40), run_before=run_before)


def slower(step: int, evaluate: bool) -> MetricsRecord:
    """Another run's record: a slower loss, a higher grad norm, fewer samples/s; an evaluation
    every 50 steps if `evaluate`."""
    record = evaluated(step, min(0.9, step / 250)) if evaluate and step % 50 == 0 else metrics_record(step)
    return replace(record, loss=2.2 * math.exp(-step / 110) + 0.2, grad_norm=record.grad_norm * 1.5, samples_per_s=record.samples_per_s * 0.8)


def compared_runs(folder: Path, *, evaluate: bool) -> LrApp:
    """Two runs under `folder`/outputs/train: `18-30-00_act` at step 200 (evaluations at 100 and
    200 if `evaluate`) and an older `09-10-00_mlp` at step 150, slower (`slower`)."""
    root = folder / "outputs" / "train" / "2026-03-04"
    act = make_run(root / "18-30-00_act", started="2026-03-04T18:30:00+00:00", step=200, steps=300)
    if evaluate:
        write_records(act / "metrics.jsonl", [evaluated(s, s / 400) if s % 100 == 0 else metrics_record(s) for s in range(10, 201, 10)])
    mlp = make_run(root / "09-10-00_mlp", started="2026-03-04T09:10:00+00:00", status="finished", step=150, steps=150, flags=("--policy.type=mlp",))
    write_records(mlp / "metrics.jsonl", [slower(s, evaluate) for s in range(10, 151, 10)])
    return LrApp(plan_runner=None, runs=[Path("outputs") / "train"], list_interval=0.05, poll_interval=0.05, hardware=FixedHardware())


async def comparing(pilot) -> None:  # type: ignore[no-untyped-def]
    """Watch the newest run, mark the other for comparison (c) and wait for both runs' lines."""
    monitor = await runs_listed(pilot, 2)
    await pilot.press("enter", "down", "c")
    await wait_until(pilot, lambda: len(monitor.records) == 20 and len(monitor.compared_columns.get(monitor.compared_runs[0], ())) == 15,
                     what="both runs' metrics")
    await settled(pilot, monitor)


def test_monitor_charts_80x24_comparing_two_runs(snap_compare, tmp_path, monkeypatch):
    """Two runs overlaid, a legend above the charts; the loss on a log scale; two charts fit."""
    monkeypatch.chdir(tmp_path)
    assert snap_compare(compared_runs(tmp_path, evaluate=False), terminal_size=(80, 24), run_before=comparing)


def test_monitor_charts_120x40_comparing_two_runs_with_evaluations_zoomed(snap_compare, tmp_path, monkeypatch):
    """The same at 120x40 with evaluations (the success-rate chart under the others), the last 100 steps (z z)."""
    monkeypatch.chdir(tmp_path)

    async def run_before(pilot) -> None:  # type: ignore[no-untyped-def]
        await comparing(pilot)
        await pilot.press("z", "z")
        await pilot.pause()

    assert snap_compare(compared_runs(tmp_path, evaluate=True), terminal_size=(120, 40), run_before=run_before)
