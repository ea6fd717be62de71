"""The Monitor's run list: runs found under the run roots (appearing, ending, stale, newest
first), the open dialog's folder completion, and the Checkpoints view on the highlighted run.
Run folders are written with lr-config's writers (`tui_support.make_run`); nothing trains."""

from __future__ import annotations

import os
import re
from dataclasses import replace
import socket
from pathlib import Path

import pytest
from tui_support import GONE_PID, app_ready, make_checkpoint, make_run, point_last, wait_until, write_run_status

from lr_config import load_run_status
from lr_config.layout import RUN_STATUS
from lr_tui import _app, _run_list
from lr_tui._app import LrApp
from lr_tui._run_list import RunFinder
from lr_tui._views.monitor import MonitorView

SIZE = (100, 30)
HOST = socket.gethostname()


def rows(monitor: MonitorView) -> list[list[str]]:
    table = monitor.query_one("#runs")
    return [[str(cell) for cell in table.get_row_at(i)[:6]] for i in range(table.row_count)]


def two_runs(root: Path) -> None:
    make_run(root / "2026-01-01" / "09-00-00_act", started="2026-01-01T09:00:00+00:00", status="finished", step=100, steps=100)
    make_run(root / "2026-01-02" / "09-00-00_mlp", started="2026-01-02T09:00:00+00:00", step=40, pid=GONE_PID, hostname=HOST,
             flags=("--policy.type=mlp", "--parallelism.dp_replicate=2", "--parallelism.dp_shard=2"), world_size=4)


@pytest.mark.asyncio
async def test_runs_appear_newest_first_and_their_status_follows_run_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = Path("outputs") / "train"
    two_runs(root)
    app = LrApp(plan_runner=None, runs=[root], list_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        await pilot.press("2")
        monitor = app.monitor_view
        await wait_until(pilot, lambda: monitor.query_one("#runs").row_count == 2, what="the two runs")
        assert rows(monitor) == [
            ["2026-01-02/09-00-00_mlp", "stale", "40/100", "mlp", "HSDP 2x2", "1.1"],
            ["2026-01-01/09-00-00_act", "finished", "100/100", "act", "single", "0.5272"],
        ]
        assert app.focused is monitor.query_one("#runs") and monitor.run_dir is None

        new = make_run(root / "2026-01-03" / "09-00-00_act", started="2026-01-03T09:00:00+00:00", step=10, pid=os.getpid(), hostname=HOST,
                       flags=("--parallelism.dp_shard=2",), world_size=2)
        # The list is read by a worker while make_run writes, so the new row may first show the
        # folder before its run.json ("no run.json yet"); it must then follow run.json.
        expected = ["2026-01-03/09-00-00_act", "running", "10/100", "act", "FSDP2 2", "1.842"]
        await wait_until(pilot, lambda: monitor.query_one("#runs").row_count == 3 and rows(monitor)[0] == expected, what="the new run")
        assert monitor.selected_run == root / "2026-01-02" / "09-00-00_mlp"  # the highlight stays on its run

        status = load_run_status(new / RUN_STATUS)
        write_run_status(new, status="finished", step=100, steps=100, pid=os.getpid(), hostname=HOST, started=status.started, world_size=2)
        await wait_until(pilot, lambda: rows(monitor)[0][1:3] == ["finished", "100/100"], what="the run to end")
        assert [r[0] for r in rows(monitor)] == ["2026-01-03/09-00-00_act", "2026-01-02/09-00-00_mlp", "2026-01-01/09-00-00_act"]


def test_the_finder_reads_a_file_again_only_when_it_changed(tmp_path, monkeypatch):
    two_runs(tmp_path)
    loads: list[Path] = []
    real = _run_list.load_run_status
    monkeypatch.setattr(_run_list, "load_run_status", lambda path: loads.append(path) or real(path))
    finder = RunFinder([tmp_path])
    first = finder.read()
    assert [i.name for i in first] == ["2026-01-02/09-00-00_mlp", "2026-01-01/09-00-00_act"] and len(loads) == 2
    assert finder.read() == first and len(loads) == 2
    finished = tmp_path / "2026-01-02" / "09-00-00_mlp"
    write_run_status(finished, status="failed", step=41, started="2026-01-02T09:00:00+00:00", world_size=4)
    assert [i.status for i in finder.read()] == ["failed", "finished"] and loads[2:] == [finished / RUN_STATUS]


def test_runs_takes_repeated_and_comma_separated_folders(monkeypatch):
    made: list[LrApp] = []
    monkeypatch.setattr(LrApp, "run", lambda self: made.append(self))
    _app.main(["--runs=a,b", "--runs", "c", "--runs=a"])
    assert made[0].run_roots == [Path("outputs/train"), Path("a"), Path("b"), Path("c")]


@pytest.mark.asyncio
async def test_the_open_dialog_completes_folder_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = make_run(Path("outputs") / "train" / "2026-01-01" / "09-00-00_act", started="2026-01-01T09:00:00+00:00")
    (tmp_path / "outputs" / "eval").mkdir()
    app = LrApp(plan_runner=None, runs=[], poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        await pilot.press("2", "o")
        await pilot.pause()
        field = app.screen.query_one("#prompt-input")

        async def complete(key: str, suggestion: str) -> str:
            """Wait for `suggestion` (it comes from a worker), then accept it with `key`."""
            await wait_until(pilot, lambda: field._suggestion == suggestion, what=f"the suggestion {suggestion}")
            await pilot.press(key)
            return field.value

        await pilot.press("ctrl+a", "ctrl+k", "o", "u")
        assert await complete("tab", "outputs/") == "outputs/"
        await pilot.press("t")
        assert await complete("tab", "outputs/train/") == "outputs/train/"
        assert await complete("right", "outputs/train/2026-01-01/") == "outputs/train/2026-01-01/"
        assert await complete("tab", "outputs/train/2026-01-01/09-00-00_act/") == "outputs/train/2026-01-01/09-00-00_act/"
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(app.monitor_view.records) == 2, what="the opened run")
        assert app.monitor_view.run_dir.resolve() == run.resolve()


@pytest.mark.asyncio
async def test_checkpoints_open_on_the_highlighted_run_and_enter_watches_it(tmp_path):
    older = make_run(tmp_path / "a", started="2026-01-01T09:00:00+00:00", status="stopped")
    newer = make_run(tmp_path / "b", started="2026-01-02T09:00:00+00:00", status="finished")
    for run, step in ((older, 20), (newer, 30)):
        make_checkpoint(run, step)
        point_last(run, step)
    app = LrApp(plan_runner=None, runs=[tmp_path], list_interval=0.05, poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        await pilot.press("2")
        monitor = app.monitor_view
        await wait_until(pilot, lambda: [r[0] for r in rows(monitor)] == ["b", "a"], what="the runs")
        await pilot.press("down", "3")
        ckpt = app.checkpoints_view
        await wait_until(pilot, lambda: ckpt.run_dir == older and "000020" in ckpt.checkpoints, what="the highlighted run's checkpoints")
        await pilot.press("2", "up", "enter")
        await wait_until(pilot, lambda: monitor.run_dir == newer and len(monitor.records) == 2, what="the watched run")
        await pilot.press("3")
        await wait_until(pilot, lambda: ckpt.run_dir == newer and list(ckpt.checkpoints) == ["000030"], what="the watched run's checkpoints")


def test_a_run_on_another_host_is_stale_once_its_run_json_has_been_silent_for_half_an_hour(tmp_path):
    """Its pid cannot be checked from here; lr-engine rewrites run.json at every logged step."""
    from datetime import datetime, timedelta, timezone

    from lr_config import save_run_status

    from lr_tui._run_info import summarize_run

    now = datetime.now(timezone.utc)
    for name, age in (("quiet", timedelta(minutes=42)), ("busy", timedelta(minutes=5))):
        make_run(tmp_path / name, started=(now - timedelta(hours=2)).isoformat(timespec="seconds"), hostname="gpu-node-7")
        status = load_run_status(tmp_path / name / RUN_STATUS)
        save_run_status(tmp_path / name / RUN_STATUS, replace(status, updated=(now - age).isoformat(timespec="seconds")))
    assert {i.name: i.status for i in RunFinder([tmp_path]).read()} == {"quiet": "stale", "busy": "running"}
    assert re.fullmatch(r"stale \(no update for 42m0\ds on gpu-node-7\)", summarize_run(tmp_path / "quiet").state)
    assert summarize_run(tmp_path / "busy").state == "running"
