"""Pilot tests of the Monitor view: a live metrics.jsonl, run.json and a failed run's log."""

from __future__ import annotations

import math
import os
import signal
import stat
import sys
from pathlib import Path

import pytest
from tui_support import app_ready, make_checkpoint, metrics_line, notices, point_last, wait_until, write_metrics, write_run_status

from lr_config import Topology
from lr_tui import _cli_tasks as cli_tasks
from lr_tui import _run_info as run_info
from lr_tui._app import LrApp
from lr_tui._cli_tasks import start_training
from lr_tui._run_control import read_launch_record
from lr_tui._screens.resume import ResumeScreen
from lr_tui._views.monitor import MonitorView
from lr_tui._widgets.choice import Choice
from lr_tui._widgets.metric_chart import MetricChart
from lr_tui._widgets.text_panel import TextPanel

pytestmark = pytest.mark.asyncio
SIZE = (100, 30)


def latest(monitor: MonitorView) -> dict[str, str]:
    table = monitor.query_one("#latest")
    return {str(row[0]): str(row[1]) for row in (table.get_row_at(i) for i in range(table.row_count))}


async def test_appended_lines_update_the_monitor_and_a_partial_line_waits(tmp_path, monkeypatch):
    # run.json says running on another host at a fixed time: not stale however long ago that is
    monkeypatch.setattr(run_info, "STALE_AFTER_S", math.inf)
    write_metrics(tmp_path / "metrics.jsonl", [5, 10, 15])
    write_run_status(tmp_path, step=15, steps=300)
    app = LrApp(tmp_path, plan_runner=None, poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        monitor = app.monitor_view
        assert app.query_one("#views").active == "monitor"
        await wait_until(pilot, lambda: len(monitor.records) == 3, what="3 records")
        assert latest(monitor)["step"] == "15"
        assert str(monitor.query_one("#run-status").render()).startswith("running   step 15/300 (5%)   ETA ")

        full, partial = metrics_line(20), metrics_line(25)
        with (tmp_path / "metrics.jsonl").open("a") as f:
            f.write(full + partial[:40])
        polls = monitor.polls
        await wait_until(pilot, lambda: monitor.polls >= polls + 2, what="two more polls")
        assert [r.step for r in monitor.records] == [5, 10, 15, 20]
        assert latest(monitor)["step"] == "20"

        with (tmp_path / "metrics.jsonl").open("a") as f:
            f.write(partial[40:])
        await wait_until(pilot, lambda: len(monitor.records) == 5, what="the completed line")
        assert latest(monitor)["loss"] == f"{monitor.records[-1].loss:.4g}"
        chart = monitor.query_one("#chart-loss", MetricChart)
        [series] = chart.series
        assert series.steps == [5, 10, 15, 20, 25] and series.values == [r.loss for r in monitor.records]
        assert str(chart.query_one(".chart-label").render()) == f"loss {latest(monitor)['loss']} · log y · all steps"


async def test_evaluations_in_the_metrics_are_shown_with_the_latest_values(tmp_path):
    """A run trained with --eval_freq: the latest evaluation (and the first, to compare) shows
    beside the latest values; a version-1 metrics line (before evaluations) still reads."""
    import json
    from dataclasses import replace

    from lr_config import EvalAggregate, to_dict
    from tui_support import metrics_record

    old = to_dict(metrics_record(5))
    del old["eval"]
    lines = [json.dumps({**old, "version": 1})]
    for step, rate in ((10, 0.2), (15, 0.4), (20, None)):
        result = None if rate is None else EvalAggregate(n_episodes=50, success_rate=rate, success_ci95_low=rate - 0.1,
                                                         success_ci95_high=rate + 0.1, avg_sum_reward=-3.5, avg_length=40.0)
        lines.append(json.dumps(to_dict(replace(metrics_record(step), eval=result))))
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    write_run_status(tmp_path, step=20, steps=300)
    app = LrApp(tmp_path, plan_runner=None, poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        monitor = app.monitor_view
        await wait_until(pilot, lambda: len(monitor.records) == 4, what="4 records")
        await wait_until(pilot, lambda: "eval success" in latest(monitor), what="the evaluation")
        values = latest(monitor)
        assert values["step"] == "20"
        assert values["eval success"] == "40.0% (30-50%) at step 15, 50 ep"
        assert values["first eval"] == "20.0% at step 10"
        assert values["eval reward"] == "-3.5"


async def test_a_new_file_in_the_same_folder_starts_the_charts_over(tmp_path):
    write_metrics(tmp_path / "metrics.jsonl", list(range(5, 105, 5)))
    app = LrApp(tmp_path, plan_runner=None, poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        monitor = app.monitor_view
        await wait_until(pilot, lambda: len(monitor.records) == 20, what="20 records")
        write_metrics(tmp_path / "metrics.jsonl", [5, 10])
        await wait_until(pilot, lambda: len(monitor.records) == 2, what="the shrunk file")
        assert [r.step for r in monitor.records] == [5, 10]
        assert monitor.query_one("#chart-lr", MetricChart).prepared.series[0].steps == [5, 10]


async def test_charts_are_downsampled_to_their_width(tmp_path):
    write_metrics(tmp_path / "metrics.jsonl", list(range(1, 1001)))
    app = LrApp(tmp_path, plan_runner=None, poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        monitor = app.monitor_view
        await wait_until(pilot, lambda: len(monitor.records) == 1000, what="1000 records")
        await pilot.pause()
        chart = monitor.query_one("#chart-loss", MetricChart)
        [drawn] = chart.prepared.series
        assert len(drawn.steps) == len(drawn.values) == chart.content_size.width < 100
        assert drawn.steps[0] > 1 and drawn.steps[-1] < 1000  # each point the mean of a span


async def test_a_failed_run_shows_its_error_and_the_tail_of_its_log(tmp_path):
    write_metrics(tmp_path / "metrics.jsonl", [5, 10])
    write_run_status(tmp_path, status="failed", step=10, steps=300, error="RuntimeError: CUDA out of memory")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "launch.log").write_text("".join(f"log line {i}\n" for i in range(100)) + "Traceback: boom\n")
    app = LrApp(tmp_path, plan_runner=None, poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        monitor = app.monitor_view
        panel = monitor.query_one("#failure-log", TextPanel)
        await wait_until(pilot, lambda: panel.display, what="the failure log")
        assert panel.text.startswith("error: RuntimeError: CUDA out of memory\n")
        assert panel.text.endswith("log line 99\nTraceback: boom") and "log line 70" not in panel.text
        assert panel.border_title == "log: logs/launch.log (last lines)"
        assert str(monitor.query_one("#run-status").render()).startswith("failed")


async def test_open_a_run_folder_by_keyboard(tmp_path, monkeypatch):
    write_metrics(tmp_path / "r" / "metrics.jsonl", [5])
    monkeypatch.chdir(tmp_path)
    app = LrApp(plan_runner=None, poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        await pilot.press("2", "o")
        await pilot.pause()
        await pilot.press("ctrl+a", "ctrl+k", "r", "enter")
        monitor = app.monitor_view
        await wait_until(pilot, lambda: len(monitor.records) == 1, what="the opened run")
        assert monitor.run_dir == Path("r")


async def test_resume_refuses_a_run_that_started_while_its_screen_was_open(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "torchrun"  # stands in for torchrun, should the resume start
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nprint('fake torchrun')\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(cli_tasks, "resolve_executable", lambda name: str(fake) if name == "torchrun" else name)
    run = tmp_path / "run"
    make_checkpoint(run, 100, topology=Topology(world_size=1, dp_replicate=1, dp_shard=1))
    point_last(run, 100)
    write_run_status(run, status="stopped", step=100, steps=300)
    app = LrApp(run, plan_runner=None, poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        monitor = app.monitor_view
        await pilot.press("r")
        await wait_until(pilot, lambda: isinstance(app.screen, ResumeScreen), what="the resume screen")
        # meanwhile the run starts again elsewhere (another lr-tui, say)
        other = start_training([sys.executable, "-c", "import time; time.sleep(300)"], run)
        try:
            await pilot.press("ctrl+r")
            await pilot.pause()
            assert not isinstance(app.screen, ResumeScreen)
            assert notices(app, "error") == [f"Not resumed: a run is still running in {run}. Stop it first (x)."]
            record = read_launch_record(run)
            assert monitor.process is None and record is not None and record.pid == other.pid
            assert "fake torchrun" not in (run / "logs" / "launch.log").read_text()
        finally:
            os.killpg(other.pid, signal.SIGKILL)
            other.wait(timeout=60)


async def test_a_run_opened_by_a_relative_and_an_absolute_path_is_listed_once(tmp_path, monkeypatch):
    write_metrics(tmp_path / "r" / "metrics.jsonl", [5])
    monkeypatch.chdir(tmp_path)
    app = LrApp([Path("r"), tmp_path / "r", Path("./r/")], plan_runner=None, poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        monitor = app.monitor_view
        await wait_until(pilot, lambda: len(monitor.records) == 1, what="the run")
        monitor.open_run(tmp_path / "r")  # as a launch or a resume names it
        (tmp_path / "link").symlink_to(tmp_path / "r")
        monitor.open_run(Path("link"))  # through a link
        await pilot.pause()
        assert monitor.run_dirs == (Path("r"),) and monitor.run_dir == Path("r")
        assert monitor.query_one("#runs").row_count == 1


def resume_screen(app: LrApp) -> ResumeScreen:
    screen = app.screen
    assert isinstance(screen, ResumeScreen)
    return screen


def resume_field(app: LrApp, key: str):  # type: ignore[no-untyped-def]
    return resume_screen(app).query_one(f"#resume-{key}")


def marked(app: LrApp) -> list[str]:
    """The labels of the resume fields marked as the ones to change."""
    return [str(label.render()) for label in resume_screen(app).query(".resume-label.-invalid")]


async def test_the_resume_screen_has_a_field_for_each_flag_its_messages_ask_for(tmp_path):
    """Processes, both degrees, steps, the checkpoint format and more flags: a refusal marks the
    fields it asks to change and names them, and filling them there gives the command."""
    run = tmp_path / "run"
    make_checkpoint(run, 300, topology=Topology(world_size=2, dp_replicate=1, dp_shard=2), checkpoint_format="dcp", weights=None, fake_dcp=True)
    point_last(run, 300)
    write_run_status(run, status="finished", step=300, steps=300)
    app = LrApp(run, plan_runner=None, poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        await pilot.press("r")
        await wait_until(pilot, lambda: isinstance(app.screen, ResumeScreen), what="the resume screen")
        screen = resume_screen(app)
        command = screen.query_one("#resume-command", TextPanel)
        labels = [str(label.render()) for label in screen.query(".resume-label")]
        assert labels == ["processes", "dp_replicate", "dp_shard", "steps", "ckpt format", "more flags"]
        assert app.focused is resume_field(app, "steps")  # the field a finished run needs
        assert resume_field(app, "nproc-per-node").value == "2"  # the saved world size
        assert resume_field(app, "dp-shard").placeholder == "saved: 2" and resume_field(app, "steps").placeholder == "saved: 300"
        # a finished run: lr-config asks for --steps, the steps field is marked and named
        assert command.has_class("-error") and command.text.startswith("--steps: the checkpoint is at step 300; pass --steps > 300")
        assert command.text.endswith("\n\n→ change steps above") and marked(app) == ["steps"]

        await pilot.press(*"600")
        await pilot.pause()
        assert not command.has_class("-error") and marked(app) == [] and "--steps=600" in command.text
        # another process count: the degrees saved (1 x 2) do not fit it
        resume_field(app, "nproc-per-node").value = "3"
        await pilot.pause()
        assert command.text.startswith("--parallelism.dp_replicate x --parallelism.dp_shard = 1 x 2 = 2, but 3 processes will run")
        assert marked(app) == ["processes", "dp_replicate", "dp_shard"]
        assert command.text.endswith("→ change processes, dp_replicate, dp_shard above")
        resume_field(app, "dp-shard").value = "-1"
        await pilot.pause()
        assert screen.plan is not None and screen.plan.ok and marked(app) == []
        assert "--nproc-per-node=3" in command.text and "--parallelism.dp_shard=-1" in command.text
        # the format of the next saves; a flag that asks for it points at its field
        choice = resume_field(app, "checkpoint-format")
        assert isinstance(choice, Choice) and choice.value == "" and choice.options[0] == ("dcp (as saved)", "")
        resume_field(app, "extra").value = "--checkpoint_async=true"
        choice.value = "safetensors"
        await pilot.pause()
        assert command.text.startswith("--checkpoint_async=true needs --checkpoint_format=dcp or safetensors_dcp")
        assert marked(app) == ["ckpt format", "more flags"]
        choice.value = "safetensors_dcp"
        await pilot.pause()
        assert screen.plan.ok and "--checkpoint_format=safetensors_dcp" in command.text and "--checkpoint_async=true" in command.text
        # the command as it runs: this environment's launcher, copied
        assert command.text.startswith(f"{cli_tasks.resolve_executable('torchrun')} \\\n  --tee=3")
        await pilot.press("ctrl+y")
        assert app.clipboard == command.text and notices(app)[-1].startswith("Could not copy the resume command: there is no terminal")
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, ResumeScreen) and app.monitor_view.process is None


async def test_a_finished_runs_events_suggest_no_resume_but_to_train_longer(tmp_path):
    run = tmp_path / "run"
    write_run_status(run, status="finished", step=300, steps=300)
    (run / "logs").mkdir()
    (run / "logs" / "launch.log").write_text(
        f"[rank0]:checkpoint saved: {run}/checkpoints/000200\n"
        f"[rank0]:checkpoint saved: {run}/checkpoints/000300\n"
        f"[rank0]:done: checkpoints in {run}/checkpoints, metrics in {run}/metrics.jsonl, model in {run}/pretrained_model\n"
        f"[rank0]:train longer with: torchrun --nproc-per-node=2 -m lr_engine.cli train --resume=true "
        f"--config_path={run}/checkpoints/last --steps=600   (any --steps above 300)\n"
    )
    app = LrApp(run, plan_runner=None, poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        monitor = app.monitor_view
        await wait_until(pilot, lambda: len(monitor.events) == 3, what="the events")
        assert [(e.title, e.advice) for e in monitor.events] == [
            ("checkpoint saved: 000200", "the run finished at step 300: a resume trains only with steps above 300"),
            ("checkpoint saved: 000300", "the run finished at step 300: a resume trains only with steps above 300"),
            ("finished at step 300", "to train longer, resume with steps above 300 (Monitor: r, the steps field); else nothing to do"),
        ]
        panel = str(monitor.query_one("#events .events-body").render())
        assert "resume from it" not in panel and "finished at step 300" in panel
