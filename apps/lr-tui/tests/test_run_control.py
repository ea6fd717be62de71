"""A real run driven from the TUI: launch, quit the TUI, reattach, stop, resume on another topology, finish.

The tiny ACT trains on 2 processes under torchrun (gloo). The first app launches it and
quits; the run keeps going (its own session). A second app opened on the output dir finds
the launch again (logs/launch.json), stops it (SIGINT to the launch's process group: final
checkpoint, run.json "stopped" with the step), then resumes it on 1 process with both dp
degrees and --steps a few beyond the stop, and watches it finish (its events then suggest
no resume but one with more steps).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from real_runs import TINY, end
from tui_support import app_ready, wait_until

from lr_tui._app import LrApp
from lr_tui._screens.prompt import ChoicePrompt
from lr_tui._screens.resume import ResumeScreen
from lr_tui._widgets.text_panel import TextPanel

pytestmark = pytest.mark.asyncio
SIZE = (100, 30)


def run_json(out: Path) -> dict[str, object]:
    try:
        return json.loads((out / "run.json").read_text())
    except (OSError, ValueError):
        return {}


async def launch_from_the_form(out: Path, dataset: Path) -> int:
    """Fill the Launch form, run it, wait for its first metrics; return the launcher's pid (the app then quits)."""
    app = LrApp(plan_runner=None, poll_interval=0.2)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        rows = app.launch_view.rows
        extra = [flag for flag in TINY if not flag.startswith("--batch_size")]
        for key, value in {"nproc_per_node": "2", "dataset_root": str(dataset), "steps": "100000", "batch_size": "8",
                           "output_dir": str(out), "extra": " ".join(extra)}.items():
            rows[key].set_value(value)
        await pilot.pause()
        await pilot.press("ctrl+r")
        monitor = app.monitor_view
        await wait_until(pilot, lambda: monitor.process is not None, what="the launch")
        assert monitor.process is not None
        await wait_until(pilot, lambda: len(monitor.records) >= 1, timeout=240, what="the first metrics")
        assert monitor.states[out].live.describe().startswith("3 alive (launcher ")  # torchrun + 2 workers
        return monitor.process.pid


async def test_launch_detach_reattach_stop_resume_and_finish(tmp_path, tiny_dataset):
    out = tmp_path / "run"
    launcher = await launch_from_the_form(out, tiny_dataset)
    try:
        os.kill(launcher, 0)  # the app is gone; the run is not

        app = LrApp(out, plan_runner=None, poll_interval=0.2, stop_grace=120)
        async with app.run_test(size=SIZE) as pilot:
            await app_ready(pilot)
            monitor = app.monitor_view
            await wait_until(pilot, lambda: out in monitor.states and monitor.states[out].live.launcher is not None, what="reattached")
            assert monitor.states[out].live.launcher.pid == launcher  # type: ignore[union-attr]

            await pilot.press("x")
            await wait_until(pilot, lambda: isinstance(app.screen, ChoicePrompt), what="the stop question")
            await pilot.press("enter")
            await wait_until(pilot, lambda: run_json(out).get("status") == "stopped", timeout=120, what="run.json stopped")
            stopped = int(run_json(out)["step"])  # type: ignore[call-overload]
            assert os.readlink(out / "checkpoints" / "last") == f"{stopped:06d}"
            assert (out / "checkpoints" / f"{stopped:06d}" / "training_state" / "training_step.json").exists()
            await wait_until(pilot, lambda: not monitor.states[out].live.alive, timeout=120, what="the processes to end")
            await wait_until(pilot, lambda: any(e.kind == "stopped" and e.rank == 0 for e in monitor.events), what="the stop event")
            assert "stopped" in str(monitor.query_one("#run-status").render())

            await pilot.press("r")
            await wait_until(pilot, lambda: isinstance(app.screen, ResumeScreen), what="the resume screen")
            screen = app.screen
            assert isinstance(screen, ResumeScreen)
            screen.query_one("#resume-nproc-per-node").value = "1"  # type: ignore[attr-defined]
            await pilot.pause()
            # the run asked for no degrees (train_config.json keeps them unset): DDP on 2 becomes 1 process
            assert screen.plan is not None and screen.plan.ok, screen.plan.problems
            screen.query_one("#resume-dp-replicate").value = "2"  # type: ignore[attr-defined]
            await pilot.pause()
            assert not screen.plan.ok  # 2 x auto does not fit 1 process: the fields to change are marked
            assert "--parallelism.dp_replicate" in screen.query_one("#resume-command", TextPanel).text
            assert screen.query_one("#resume-dp-replicate-label").has_class("-invalid")
            for field, value in (("dp-replicate", "1"), ("dp-shard", "1"), ("steps", str(stopped + 3))):
                screen.query_one(f"#resume-{field}").value = value  # type: ignore[attr-defined]
            await pilot.pause()
            assert screen.plan.ok, screen.plan.problems
            assert str(screen.query_one("#resume-exact").render()) == (
                "sample-exact: no (batch 8 x dp 2 -> 8 x dp 1); resumes at the right epoch and offset"
            )
            command = screen.query_one("#resume-command", TextPanel).text
            assert "--resume=true" in command and f"--steps={stopped + 3}" in command and "--nproc-per-node=1" in command
            await pilot.press("ctrl+r")
            await wait_until(pilot, lambda: monitor.process is not None, what="the resumed launch")
            resumed = monitor.process
            assert resumed is not None
            await wait_until(pilot, lambda: run_json(out).get("status") == "finished", timeout=240, what="run.json finished")
            assert run_json(out)["step"] == stopped + 3 and resumed.wait(timeout=60) == 0
            await wait_until(pilot, lambda: any(e.kind == "resume_changed" for e in monitor.events), what="the resume warning")
            assert os.readlink(out / "checkpoints" / "last") == f"{stopped + 3:06d}"
            await wait_until(pilot, lambda: any(e.kind == "finished" for e in monitor.events), what="the finished event")
            assert not any("resume with r" in e.advice or "resume from it" in e.advice for e in monitor.events)
    finally:
        end(launcher)
