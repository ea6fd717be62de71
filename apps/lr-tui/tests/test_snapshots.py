"""Snapshots of each view at 100x30 (and Launch at 80x24) on the checked-in sample run.

The sample folder (`sample_run/`, made by `tui_support.build_sample_run`) is opened by a
relative path from this folder, and the plan comes from a fixed stand-in, so nothing in
the pictures depends on the clock, the checkout path or the engine.
Update with `pytest apps/lr-tui/tests/test_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tui_support import app_ready, sample_planner, wait_until

from lr_tui.app import LrApp

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def _in_tests_folder(monkeypatch):
    monkeypatch.chdir(HERE)


def sample_app(run: bool = True) -> LrApp:
    return LrApp(Path("sample_run") if run else None, plan_runner=sample_planner, plan_delay=0.01, poll_interval=0.05)


async def plan_shown(pilot) -> None:  # type: ignore[no-untyped-def]
    await app_ready(pilot)
    await wait_until(pilot, lambda: pilot.app.query_one("#plan").text.startswith("lr-engine dry run"), what="the plan")


def test_launch_view(snap_compare):
    assert snap_compare(sample_app(run=False), terminal_size=(100, 30), run_before=plan_shown)


def test_launch_view_80x24(snap_compare):
    assert snap_compare(sample_app(run=False), terminal_size=(80, 24), run_before=plan_shown)


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
        await wait_until(pilot, lambda: len(pilot.app.monitor_view.records) == 40, what="the sample metrics")
        await pilot.pause()

    assert snap_compare(sample_app(), terminal_size=(100, 30), run_before=run_before)


def test_checkpoints_view(snap_compare):
    async def run_before(pilot) -> None:  # type: ignore[no-untyped-def]
        await app_ready(pilot)
        await pilot.press("3")
        await pilot.pause()

    assert snap_compare(sample_app(), terminal_size=(100, 30), run_before=run_before)


def test_help_screen(snap_compare):
    async def run_before(pilot) -> None:  # type: ignore[no-untyped-def]
        await app_ready(pilot)
        await pilot.press("question_mark")
        await pilot.pause()

    assert snap_compare(sample_app(run=False), terminal_size=(100, 30), run_before=run_before)
