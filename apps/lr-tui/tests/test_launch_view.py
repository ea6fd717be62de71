"""Pilot tests of the Launch view: the form drives the preview, validation, plan and Run."""

from __future__ import annotations

import asyncio
import json
import stat
import sys
from pathlib import Path

import pytest
from tui_support import app_ready, wait_until

from lr_config import LaunchSpec, build_launch, format_command, parse_train_config
from lr_tui import _cli_tasks as cli_tasks
from lr_tui._app import LrApp
from lr_tui._views.launch import LaunchView
from lr_tui._widgets.form_row import FormRow
from lr_tui._widgets.text_panel import TextPanel

pytestmark = pytest.mark.asyncio
SIZE = (100, 30)


class FakePlanner:
    """Stands in for `lr-engine train --dry_run=true`: records argv and answers at once;
    with `hang_first`, the first plan never finishes unless it is cancelled."""

    def __init__(self, hang_first: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.cancelled = 0
        self.hang_first = hang_first

    async def __call__(self, argv: list[str]) -> tuple[int, str]:
        self.calls.append(argv)
        if self.hang_first and len(self.calls) == 1:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return 0, "plan for " + " ".join(argv[3:])


async def type_into(pilot, key: str, text: str, *, keep: str = "") -> None:  # type: ignore[no-untyped-def]
    """Click the field and type `text` key by key (after `keep`, set directly: typing is slow)."""
    field = pilot.app.query_one(f"#field-{key}")
    field.value = keep
    await pilot.click(f"#field-{key}")
    await pilot.press("end", *list(text))


def panel_text(app: LrApp, selector: str) -> str:
    return app.query_one(selector, TextPanel).text


def error_text(app: LrApp, key: str) -> str:
    return str(app.query_one(f"#error-{key}").render())


async def test_editing_fields_updates_preview_validation_and_effective_batch():
    app = LrApp(plan_runner=FakePlanner(), plan_delay=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        await type_into(pilot, "nproc_per_node", "4")
        await type_into(pilot, "batch_size", "8")
        await type_into(pilot, "grad_accum", "2")
        await pilot.pause()
        cfg = parse_train_config(["--batch_size=8", "--accelerator.gradient_accumulation.steps=2"])
        assert panel_text(app, "#preview") == format_command(build_launch(LaunchSpec(nproc_per_node=4), cfg))
        assert str(app.query_one("#batch").render()).splitlines()[0] == "batch 8 x dp_world 4 x grad_accum 2 = 64 effective"

        await type_into(pilot, "dp_shard", "3")
        await pilot.pause()
        row = app.query_one("#row-dp_shard", FormRow)
        assert row.has_class("-invalid")
        assert error_text(app, "dp_shard").startswith(
            "--parallelism.dp_replicate x --parallelism.dp_shard = 1 x 3 = 3, but 4 processes will run"
        )
        assert app.query_one("#row-dp_replicate", FormRow).has_class("-marked")
        assert panel_text(app, "#preview") == "1 problem in the settings; see dp_replicate, dp_shard"
        assert str(app.query_one("#batch").render()) == "effective batch: fix the settings first"

        await pilot.press("backspace", "minus", "1")
        await pilot.pause()
        assert not row.has_class("-invalid") and error_text(app, "dp_shard") == ""
        assert "--parallelism.dp_shard=-1" in panel_text(app, "#preview")
        assert str(app.query_one("#batch").render()).splitlines()[1] == "FSDP2 dp_replicate=1 dp_shard=4 world=4"


async def test_free_text_flags_are_parsed_and_checked_as_typed():
    app = LrApp(plan_runner=FakePlanner(), plan_delay=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        await type_into(pilot, "extra", "130", keep="--seed=3 --policy.dim_model=")
        await pilot.pause()
        assert error_text(app, "extra") == "--policy.dim_model: must be divisible by --policy.n_heads (4), got 130"
        assert app.query_one("#row-extra", FormRow).has_class("-invalid")
        await pilot.press("backspace", "backspace", "backspace", "6", "4")
        await pilot.pause()
        assert error_text(app, "extra") == ""
        assert panel_text(app, "#preview").endswith("--seed=3 \\\n  --policy.dim_model=64")


async def test_plan_is_debounced_runs_in_the_background_and_the_newest_wins():
    planner = FakePlanner(hang_first=True)
    app = LrApp(plan_runner=planner, plan_delay=1.0)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        await wait_until(pilot, lambda: len(planner.calls) == 1, what="the first plan")
        procs = app.launch_view.rows["nproc_per_node"]
        procs.set_value("2")
        procs.set_value("4")  # 2 then 4 within the debounce: one plan, for 4
        await pilot.pause()
        # the form answered at once, while the first plan still runs
        assert "--nproc-per-node=4" in panel_text(app, "#preview")
        assert planner.cancelled == 0 and panel_text(app, "#plan") == "planning ..."
        await wait_until(pilot, lambda: "world size 4" in app.query_one("#plan", TextPanel).border_subtitle, what="the plan for 4")
        assert [argv[3:6] for argv in planner.calls] == [
            ["train", "--dry_run=true", "--world_size=1"],
            ["train", "--dry_run=true", "--world_size=4"],
        ]
        assert planner.calls[-1][:3] == [sys.executable, "-m", "lr_engine.cli"]
        assert planner.cancelled == 1
        assert panel_text(app, "#plan") == "plan for train --dry_run=true --world_size=4"


async def test_real_subprocess_plan_shows_the_cli_output():
    async def planner(argv: list[str]) -> tuple[int, str]:
        from lr_tui._views.launch import run_plan

        # the same runner the app uses, on a stand-in for lr_engine.cli (the real one takes
        # seconds to import torch); the argv tail is the real dry-run flags
        stand_in = [sys.executable, "-c", "import sys; print('planned', *sys.argv[1:]); sys.exit(3)", *argv[3:]]
        return await run_plan(stand_in)

    app = LrApp(plan_runner=planner, plan_delay=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        await wait_until(pilot, lambda: panel_text(app, "#plan").startswith("planned"), what="the plan output")
        plan = app.query_one("#plan", TextPanel)
        assert plan.text == "planned train --dry_run=true --world_size=1"
        assert plan.has_class("-error") and plan.border_subtitle == "world size 1, exit 3"


async def test_copy_puts_the_exact_command_on_the_clipboard():
    app = LrApp(plan_runner=None)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        await type_into(pilot, "steps", "50")
        await pilot.press("ctrl+y")
        assert app.clipboard == format_command(build_launch(LaunchSpec(), parse_train_config(["--steps=50"])))


FAKE_TORCHRUN = """\
#!{python}
# Stands in for torchrun: records its argv and writes what lr-engine would.
import json, sys
from pathlib import Path
print("fake torchrun", json.dumps(sys.argv[1:]), flush=True)
out = Path(next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--output_dir=")))
sys.path.insert(0, {support!r})
from tui_support import write_metrics, write_run_status
write_metrics(out / "metrics.jsonl", [5, 10, 15])
write_run_status(out, step=15, steps=50)
"""


async def test_run_starts_the_command_detached_and_opens_its_monitor(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "torchrun"
    fake.parent.mkdir()
    fake.write_text(FAKE_TORCHRUN.format(python=sys.executable, support=str(Path(__file__).parent)))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(cli_tasks, "resolve_executable", lambda name: str(fake) if name == "torchrun" else name)
    monkeypatch.chdir(tmp_path)
    app = LrApp(plan_runner=None, poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        await type_into(pilot, "steps", "50")
        await pilot.press("ctrl+r")
        await pilot.pause()
        output_dir = Path(app.query_one("#field-output_dir").value)
        assert output_dir.parent.parent == Path("outputs/train") and output_dir.name.endswith("_act")
        assert app.query_one("#views").active == "monitor"
        monitor = app.monitor_view
        assert monitor.run_dir == output_dir and monitor.process is not None
        await wait_until(pilot, lambda: len(monitor.records) == 3, what="the launched run's metrics")
        assert monitor.process.wait(timeout=60) == 0
        log = (tmp_path / output_dir / "logs" / "launch.log").read_text()
        argv = json.loads(log.splitlines()[0].removeprefix("fake torchrun "))
        rank_logs = ["--tee=3", f"--log-dir={output_dir}/logs/ranks", "--log-line-prefix-template=[rank${rank}]:"]
        assert argv == [*rank_logs, "--standalone", "--nproc-per-node=1", "-m", "lr_engine.cli", "train", f"--output_dir={output_dir}", "--steps=50"]
        assert "--tee=3" in app.query_one("#preview", TextPanel).text  # what ran is what the preview showed


async def test_slurm_run_saves_the_script_and_creates_the_log_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = LrApp(plan_runner=None)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        view = app.query_one(LaunchView)
        view.rows["launcher"].set_value("slurm")
        await type_into(pilot, "nproc_per_node", "4")
        await type_into(pilot, "output_dir", "run")
        await pilot.pause()
        assert app.query_one("#preview", TextPanel).border_title == "Slurm script"
        await pilot.press("ctrl+r")
        await pilot.pause()
        script = tmp_path / "run" / "train.slurm"
        assert script.read_text() == panel_text(app, "#preview")
        assert script.read_text().startswith("#!/bin/bash\n#SBATCH --job-name=act\n")
        assert (tmp_path / "run" / "logs").is_dir()


async def test_presets_save_and_load_a_train_config_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    preset = tmp_path / "p.json"
    app = LrApp(plan_runner=None)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        await type_into(pilot, "steps", "123")
        await type_into(pilot, "extra", "7", keep="--log_freq=")
        await pilot.press("ctrl+s")
        await pilot.pause()
        await pilot.press("ctrl+a", "ctrl+k", *"p.json", "enter")
        await pilot.pause()
        saved = json.loads(preset.read_text())
        assert saved["steps"] == 123 and saved["log_freq"] == 7 and saved["version"] == 1

        await type_into(pilot, "steps", "9")
        await type_into(pilot, "extra", "")
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("ctrl+a", "ctrl+k", *"q.json")
        await pilot.pause()
        assert str(app.screen.query_one("#prompt-error").render()) == "q.json: no such file"
        await pilot.press("ctrl+a", "ctrl+k", *"p.json", "enter")
        await pilot.pause()
        view = app.query_one(LaunchView)
        assert view.rows["steps"].value == "123" and view.rows["extra"].value == "--log_freq=7"
        assert view.plan.cfg is not None and view.plan.cfg.steps == 123
