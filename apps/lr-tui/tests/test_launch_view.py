"""Pilot tests of the Launch view: the form drives the preview, validation, plan and Run."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import stat
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from real_runs import end
from tui_support import SAMPLE_RUN, app_ready, make_checkpoint, notices, point_last, wait_until, write_run_status

from lr_config import TRAIN_CONFIG_VERSION, LaunchSpec, Topology, build_launch, format_command, load_run_status, parse_train_config, save_json, to_dict
from lr_tui import _cli_tasks as cli_tasks
from lr_tui import _clipboard as clipboard
from lr_tui._app import LrApp
from lr_tui._run_control import read_launch_record
from lr_tui._screens.prompt import TextPrompt
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
    field.scroll_visible(animate=False)  # the form scrolls: a field below its fold is brought up first, as a user would
    await pilot.pause()
    await pilot.click(f"#field-{key}")
    await pilot.press("end", *list(text))


def panel_text(app: LrApp, selector: str) -> str:
    return app.query_one(selector, TextPanel).text


def static_text(app: LrApp, selector: str) -> str:
    return str(app.query_one(selector).render())


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
        assert panel_text(app, "#preview") == format_command(cli_tasks.launch_argv(build_launch(LaunchSpec(nproc_per_node=4), cfg)))
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
        expected = "--policy.dim_model: must be divisible by --policy.n_heads (4), got 130"
        await wait_until(pilot, lambda: error_text(app, "extra") == expected, what="the typed value's error")
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


async def test_a_running_plan_counts_its_seconds():
    """A dry run takes seconds (lr-engine imports torch): its panel says it is running, and for how long."""
    release = asyncio.Event()

    async def slow_planner(argv: list[str]) -> tuple[int, str]:
        await release.wait()
        return 0, "planned"

    app = LrApp(plan_runner=slow_planner, plan_delay=0.01)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        plan = app.query_one("#plan", TextPanel)
        running = re.compile(r"running lr-engine --dry_run: (\d+) s")

        def seconds() -> int:
            match = running.fullmatch(plan.border_subtitle)
            return int(match.group(1)) if match else -1

        await wait_until(pilot, lambda: seconds() >= 0, what="the plan to start")
        assert plan.text == "planning ..."
        first = seconds()
        await wait_until(pilot, lambda: seconds() > first, what="a second to be counted")
        release.set()
        await wait_until(pilot, lambda: plan.text == "planned", what="the plan")
        assert plan.border_subtitle == "world size 1"


TINY_ACT = "--policy.dim_model=32 --policy.dim_feedforward=64 --policy.n_heads=2"
"""The tiny ACT (about 51k parameters) of the real plan and launch below."""


async def test_the_plan_panel_shows_the_real_dry_run(tiny_dataset):
    """The app's own planner runs the real `lr-engine train --dry_run=true` for what the form
    says: 2 processes, dp_shard 2, batch 8, the tiny ACT on the tiny dataset."""
    app = LrApp()  # as `lr-tui` makes it: the default planner runs lr_engine.cli in a subprocess
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        settings = {"nproc_per_node": "2", "dp_shard": "2", "batch_size": "8", "dataset_root": str(tiny_dataset), "extra": TINY_ACT}
        for key, value in settings.items():  # at once: one plan for them (typing is covered above)
            app.launch_view.rows[key].set_value(value)
        topology = "FSDP2 dp_replicate=1 dp_shard=2 world=2"  # dp_shard left to auto is DDP for 2
        await wait_until(pilot, lambda: topology in panel_text(app, "#plan"), timeout=120, what="the dry run's plan")
        plan = app.query_one("#plan", TextPanel)
        lines = plan.text.splitlines()
        assert lines[:2] == [
            "lr-engine dry run: 2 processes, nothing will be trained",
            f"batch_size 8 x dp_world_size 2 x grad_accum 1 = effective batch 16 (topology: {topology})",
        ], plan.text
        params = re.fullmatch(r"policy act: ([\d,]+) parameters \(\1 trainable\)", lines[2])
        assert params is not None and int(params[1].replace(",", "")) < 100_000, lines[2]  # the tiny ACT, not the default 1M
        assert lines[3] == "FSDP units (the policy's _fsdp_wrap_modules): 5, then the root"
        assert [line.split()[:2] for line in lines[4:9]] == [
            ["model.vae_encoder.layers.0", "ACTEncoderLayer"], ["model.vae_encoder.layers.1", "ACTEncoderLayer"],
            ["model.encoder.layers.0", "ACTEncoderLayer"], ["model.encoder.layers.1", "ACTEncoderLayer"],
            ["model.decoder.layers.0", "ACTDecoderLayer"],
        ]
        assert lines[-1].startswith("per-rank memory estimate (fp32 master weights, adamw): parameters ")
        assert plan.border_subtitle == "world size 2" and not plan.has_class("-error")


async def test_copy_puts_the_command_as_it_runs_on_the_clipboard_or_says_it_could_not(monkeypatch):
    app = LrApp(plan_runner=None)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        await type_into(pilot, "steps", "50")
        await pilot.press("ctrl+y")
        built = build_launch(LaunchSpec(), parse_train_config(["--steps=50"]))
        torchrun = cli_tasks.resolve_executable("torchrun")  # this environment's, where a bare `torchrun` is not on PATH
        assert app.clipboard == panel_text(app, "#preview") == format_command([torchrun, *built[1:]])
        assert Path(torchrun).is_absolute() and app.clipboard.startswith(f"{torchrun} \\\n  --standalone")
        # headless, the OSC 52 write reaches no terminal: said, with where to copy it by hand
        assert notices(app) == [
            "Could not copy the launch command: there is no terminal (a headless app). "
            "It is shown in the command panel: select it (shift+drag in most terminals) to copy by hand."
        ]
        monkeypatch.setattr(clipboard, "clipboard_problem", lambda app: None)  # a terminal that takes OSC 52
        app.clear_notifications()
        await pilot.press("ctrl+y")
        assert notices(app) == ["Copied the launch command to the clipboard."]


class _Terminal:
    """What `clipboard_problem` reads of the app and of its output stream."""

    is_headless = False

    def __init__(self, tty: bool = True) -> None:
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


async def test_the_clipboard_says_which_terminals_cannot_take_a_copy(monkeypatch):
    for name in ("TERM_PROGRAM", "TMUX", "STY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    app = _Terminal()
    monkeypatch.setattr(sys, "__stderr__", _Terminal(tty=False))
    assert clipboard.clipboard_problem(app) == "the app's output is not a terminal"  # type: ignore[arg-type]
    monkeypatch.setattr(sys, "__stderr__", _Terminal())
    assert clipboard.clipboard_problem(app) is None  # type: ignore[arg-type]
    monkeypatch.setenv("TMUX", "/tmp/tmux-0/default,1,0")
    monkeypatch.setattr(clipboard, "_tmux_passes_clipboard", lambda: False)
    assert "tmux set -s set-clipboard on" in (clipboard.clipboard_problem(app) or "")  # type: ignore[arg-type]
    monkeypatch.setattr(clipboard, "_tmux_passes_clipboard", lambda: True)
    assert clipboard.clipboard_problem(app) is None  # type: ignore[arg-type]
    monkeypatch.setenv("TERM_PROGRAM", "Apple_Terminal")
    assert (clipboard.clipboard_problem(app) or "").startswith("macOS Terminal ignores clipboard writes")  # type: ignore[arg-type]


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

STILL_RUNNING = "import time\ntime.sleep(300)\n"
"""Appended to FAKE_TORCHRUN: the launch keeps running after its metrics."""


def install_fake_torchrun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str = FAKE_TORCHRUN) -> None:
    """Launches run `script` (formatted as FAKE_TORCHRUN) where they would run torchrun."""
    fake = tmp_path / "bin" / "torchrun"
    fake.parent.mkdir()
    fake.write_text(script.format(python=sys.executable, support=str(Path(__file__).parent)))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(cli_tasks, "resolve_executable", lambda name: str(fake) if name == "torchrun" else name)


async def test_run_starts_the_command_detached_and_opens_its_monitor(tmp_path, monkeypatch):
    install_fake_torchrun(tmp_path, monkeypatch)
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
        record = read_launch_record(tmp_path / output_dir)
        assert record is not None and record.argv == [str(tmp_path / "bin" / "torchrun"), *argv]
        assert app.query_one("#preview", TextPanel).text == format_command(record.argv)  # what ran is what the preview showed


@pytest.mark.multiprocess
async def test_run_starts_real_torchrun_and_the_monitor_follows_it_to_the_end(tiny_dataset, tmp_path, monkeypatch):
    """Ctrl+r starts the venv's real `torchrun`: 2 processes (FSDP2) train the tiny ACT for 4
    steps on the tiny dataset; the Monitor shows the metrics and the finished run."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "run"
    app = LrApp(plan_runner=None, poll_interval=0.1)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        rows = app.launch_view.rows
        settings = {"nproc_per_node": "2", "dp_shard": "2", "dataset_root": str(tiny_dataset), "steps": "4", "batch_size": "4",
                    "output_dir": str(out), "extra": f"{TINY_ACT} --log_freq=1"}
        for key, value in settings.items():
            rows[key].set_value(value)
        await pilot.pause()
        assert app.launch_view.plan.ok, app.launch_view.plan.problems
        await pilot.press("ctrl+r")
        await pilot.pause()
        monitor = app.monitor_view
        process = monitor.process
        assert process is not None and monitor.run_dir == out and app.query_one("#views").active == "monitor"
        try:
            await wait_until(pilot, lambda: process.poll() is not None, timeout=300, what="the launch to end")
            log = (out / "logs" / "launch.log").read_text()
            assert process.returncode == 0, log[-3000:]
            await wait_until(pilot, lambda: monitor.summary is not None and monitor.summary.state == "finished" and len(monitor.records) == 4,
                             timeout=60, what="the Monitor to show the finished run")
            assert str(monitor.query_one("#run-status").render()).startswith("finished   step 4/4 (100%)")
            assert [r.step for r in monitor.records] == [1, 2, 3, 4]
            runs = monitor.query_one("#runs")
            assert [str(cell) for cell in runs.get_row(str(out))[:3]] == [str(out), "finished", "4/4"]
            # the events of a finished run suggest no resume, but one that trains longer
            await wait_until(pilot, lambda: any(e.kind == "finished" for e in monitor.events), what="the finished event")
            saved = [e for e in monitor.events if e.kind == "checkpoint_saved"]
            assert saved and all(e.advice == "the run finished at step 4: a resume trains only with steps above 4" for e in saved)
        finally:
            end(process.pid)
            process.wait(timeout=60)
    assert load_run_status(out / "run.json").status == "finished"
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    assert os.readlink(out / "checkpoints" / "last") == "000004"
    banner = "batch_size 4 x dp_world_size 2 x grad_accum 1 = effective batch 8 (topology: FSDP2 dp_replicate=1 dp_shard=2 world=2)"
    assert f"[rank0]:{banner}" in log.splitlines()  # the form's layout, with the TUI's rank prefix on the log


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


async def test_slurm_run_never_overwrites_a_script_and_writes_it_whole(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "run" / "train.slurm"
    script.parent.mkdir()
    script.write_text("#!/bin/bash\n# edited by hand\n")
    app = LrApp(plan_runner=None)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        view = app.query_one(LaunchView)
        view.rows["launcher"].set_value("slurm")
        await type_into(pilot, "nproc_per_node", "4")
        await type_into(pilot, "output_dir", "run")
        await pilot.pause()
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert notices(app, "error") == [
            "Not saved: run/train.slurm already exists (it may hold your edits). Remove it, or choose another output dir."
        ]
        assert script.read_text() == "#!/bin/bash\n# edited by hand\n"

        script.unlink()
        app.clear_notifications()
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert notices(app) == ["Saved run/train.slurm. Submit it with: sbatch run/train.slurm"]
        assert script.read_text() == panel_text(app, "#preview")
        umask = os.umask(0o022)
        os.umask(umask)
        assert stat.S_IMODE(script.stat().st_mode) == 0o777 & ~umask  # 0755 under 022
        assert sorted(p.name for p in script.parent.iterdir()) == ["logs", "train.slurm"]  # no temp file left


async def test_a_slurm_resume_writes_its_own_script_beside_the_runs(tmp_path, monkeypatch):
    """A resume continues in the run folder, which holds the script of the first launch: the
    resume's is named for its checkpoint, and that one is never written over either."""
    monkeypatch.chdir(tmp_path)
    run = Path(shutil.copytree(SAMPLE_RUN, tmp_path / "run"))
    (run / "train.slurm").write_text("#!/bin/bash\n# the first launch\n")
    app = LrApp(plan_runner=None)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        view = app.query_one(LaunchView)
        view.rows["launcher"].set_value("slurm")
        await type_into(pilot, "nproc_per_node", "2")
        await type_into(pilot, "extra", f"--config_path={run}/checkpoints/last --resume=true")
        await pilot.pause()
        assert view.plan.ok and view.plan.cfg is not None and view.plan.cfg.output_dir == run, view.plan.problems
        await pilot.press("ctrl+r")
        await pilot.pause()
        resumed = run / "train.resume-000200.slurm"
        assert notices(app)[-1] == f"Saved {resumed}. Submit it with: sbatch {resumed}"
        assert resumed.read_text() == panel_text(app, "#preview") and "--resume=true" in resumed.read_text()
        assert (run / "train.slurm").read_text() == "#!/bin/bash\n# the first launch\n"
        app.clear_notifications()
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert notices(app, "error") == [f"Not saved: {resumed} already exists (it may hold your edits). Remove it, or choose another output dir."]


async def test_loading_a_preset_never_reads_a_dry_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save_json(tmp_path / "plan.json", to_dict(parse_train_config(["--dry_run=true", "--world_size=8", "--steps=77"])))
    app = LrApp(plan_runner=None)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        view = app.query_one(LaunchView)
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("ctrl+a", "ctrl+k", *"plan.json", "enter")
        await pilot.pause()
        assert view.rows["steps"].value == "77" and view.rows["extra"].value == ""
        assert view.plan.cfg is not None and (view.plan.cfg.dry_run, view.plan.cfg.world_size) == (False, None)


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
        assert saved["steps"] == 123 and saved["log_freq"] == 7 and saved["version"] == TRAIN_CONFIG_VERSION

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


async def test_run_refuses_a_folder_where_a_run_runs_or_that_holds_one(tmp_path, monkeypatch):
    install_fake_torchrun(tmp_path, monkeypatch, FAKE_TORCHRUN + STILL_RUNNING)
    monkeypatch.chdir(tmp_path)
    app = LrApp(plan_runner=None, poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        await type_into(pilot, "output_dir", "run")
        await pilot.press("ctrl+r")
        monitor = app.monitor_view
        await wait_until(pilot, lambda: len(monitor.records) == 3, what="the launched run's metrics")
        first = monitor.process
        assert first is not None and app.query_one("#views").active == "monitor"
        try:
            log = tmp_path / "run" / "logs" / "launch.log"
            assert log.read_text().count("fake torchrun") == 1

            await pilot.press("1")  # the output dir field still says "run"
            await pilot.pause()
            await pilot.press("ctrl+r")
            await pilot.pause()
            assert notices(app, "error") == [
                "Not started: a run is still running in run. Stop it in the Monitor (x), or choose another output dir."
            ]
            assert app.query_one("#views").active == "launch" and monitor.process is first
            record = read_launch_record(Path("run"))
            assert record is not None and record.pid == first.pid  # the Monitor still follows the first launch
            assert log.read_text().count("fake torchrun") == 1

            os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=60)
            app.clear_notifications()
            await pilot.press("ctrl+r")  # nothing runs there now, but it holds the run's files
            await pilot.pause()
            assert notices(app, "error") == [
                "Not started: run already holds a run. Choose another output dir, or resume it (Monitor: r)."
            ]
            app.launch_view.rows["launcher"].set_value("slurm")
            await pilot.pause()
            app.clear_notifications()
            await pilot.press("ctrl+r")  # nor is a Slurm script written into it
            await pilot.pause()
            assert notices(app, "error") == [
                "Not started: run already holds a run. Choose another output dir, or resume it (Monitor: r)."
            ]
            assert not (tmp_path / "run" / "train.slurm").exists()
            assert log.read_text().count("fake torchrun") == 1 and read_launch_record(Path("run")) == record
        finally:  # the first launch, and a second one should it have started
            for pid in {first.pid, getattr(read_launch_record(Path("run")), "pid", first.pid)}:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            first.wait(timeout=60)


async def test_a_resume_typed_in_more_flags_continues_in_its_run_folder(tmp_path, monkeypatch):
    install_fake_torchrun(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)
    run = Path("runs/A")
    make_checkpoint(run, 100, topology=Topology(world_size=1, dp_replicate=1, dp_shard=1))
    point_last(run, 100)
    write_run_status(run, status="stopped", step=100, steps=300)
    app = LrApp(plan_runner=None, poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        await type_into(pilot, "extra", "t", keep="--resume=true --config_path=runs/A/checkpoints/las")
        await pilot.pause()
        # the fields came from the checkpoint (batch 8, not the form's 32), the output dir is left
        # to the parser: the run folder of the checkpoint (made absolute), not the one saved in it
        view = app.launch_view
        assert view.rows["batch_size"].value == "8" and view.rows["output_dir"].value == ""
        assert "Fields filled from runs/A/checkpoints/last" in notices(app)
        preview = panel_text(app, "#preview")
        assert f"--output_dir={tmp_path / run}" in preview and "--batch_size" not in preview
        await pilot.press("ctrl+r")  # the folder holds a run, but this command resumes it
        await pilot.pause()
        monitor = app.monitor_view
        assert app.query_one("#field-output_dir").value == ""
        assert monitor.run_dir == tmp_path / run and monitor.process is not None
        assert monitor.process.wait(timeout=60) == 0
        argv = json.loads((tmp_path / run / "logs" / "launch.log").read_text().splitlines()[0].removeprefix("fake torchrun "))
        assert f"--output_dir={tmp_path / run}" in argv and "--resume=true" in argv
        assert not any(a.startswith("--batch_size") for a in argv)
        assert not (tmp_path / "outputs").exists()


async def test_a_config_path_typed_in_more_flags_fills_the_fields_from_its_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(SAMPLE_RUN, tmp_path / "run")  # checkpoint 200: batch_size 8, dcp, dp_shard 2
    app = LrApp(plan_runner=None)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        view = app.launch_view
        await type_into(pilot, "nproc_per_node", "2")
        await type_into(pilot, "extra", "0", keep="--config_path=run/checkpoints/00020")
        await pilot.pause()
        rows = view.rows
        assert [rows[k].value for k in ("batch_size", "checkpoint_format", "dp_shard", "output_dir")] == ["8", "dcp", "2", "outputs/train/sample_run"]
        assert rows["nproc_per_node"].value == "2" and rows["extra"].value == "--config_path=run/checkpoints/000200"
        assert notices(app) == ["Fields filled from run/checkpoints/000200"]
        app.clear_notifications()
        preview = panel_text(app, "#preview")
        assert "--batch_size" not in preview and "--checkpoint_format" not in preview
        assert not app.query_one("#notes").display

        await type_into(pilot, "batch_size", "16")  # a deliberate change: emitted, noted, kept
        await pilot.pause()
        assert "--batch_size=16" in panel_text(app, "#preview")
        notes = app.query_one("#notes")
        assert notes.display and str(notes.render()) == "overrides run/checkpoints/000200: --batch_size=16 (file: 8)"
        assert rows["batch_size"].value == "16" and notices(app) == []  # not filled again

        # asking to resume it: filled again but for the field changed by hand, the output dir left
        # to the parser (the run folder)
        await type_into(pilot, "extra", "e", keep="--config_path=run/checkpoints/000200 --resume=tru")
        await pilot.pause()
        assert rows["batch_size"].value == "16" and rows["output_dir"].value == ""
        assert f"--output_dir={tmp_path / 'run'}" in panel_text(app, "#preview")
        assert notices(app)[-1] == "Fields filled from run/checkpoints/000200; kept yours: batch size"


async def test_a_resume_typed_in_more_flags_keeps_the_fields_set_before_it(tmp_path, monkeypatch):
    """The fields a person set, then `--resume=true --config_path=...` typed in "more flags": those
    fields stay (and override the checkpoint's settings, as the note says); the others fill from it."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(SAMPLE_RUN, tmp_path / "run")  # last: 000200, batch_size 8, dcp, dp_shard 2, steps 300
    app = LrApp(plan_runner=None)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        view, rows = app.launch_view, app.launch_view.rows
        await type_into(pilot, "nproc_per_node", "2")
        await type_into(pilot, "steps", "500")
        await type_into(pilot, "lr", "0.0005")
        await type_into(pilot, "extra", "t", keep="--resume=true --config_path=run/checkpoints/las")
        await pilot.pause()
        assert [rows[k].value for k in ("steps", "lr", "nproc_per_node")] == ["500", "0.0005", "2"]  # as typed
        assert [rows[k].value for k in ("batch_size", "checkpoint_format", "dp_shard", "output_dir")] == ["8", "dcp", "2", ""]
        assert notices(app) == ["Fields filled from run/checkpoints/last; kept yours: steps, lr"]
        assert str(app.query_one("#notes").render()) == "overrides run/checkpoints/last: --steps=500 (file: 300), --optimizer.lr=0.0005 (file: 0.001)"
        assert view.plan.ok and view.plan.cfg is not None, view.plan.problems
        assert (view.plan.cfg.steps, view.plan.cfg.optimizer.lr, view.plan.cfg.batch_size) == (500, 0.0005, 8)
        preview = panel_text(app, "#preview")
        assert "--steps=500" in preview and "--optimizer.lr=0.0005" in preview and "--batch_size" not in preview


async def test_save_preset_never_overwrites_and_a_failed_write_is_an_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    saved = make_checkpoint(Path("run"), 100) / "pretrained_model" / "train_config.json"
    before = saved.read_text()
    app = LrApp(plan_runner=None)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        await type_into(pilot, "steps", "123")
        await pilot.press("ctrl+s")
        await pilot.pause()
        for existing in (str(saved), "run"):  # a checkpoint's config, a folder
            await pilot.press("ctrl+a", "ctrl+k", *existing, "enter")
            await pilot.pause()
            assert isinstance(app.screen, TextPrompt)
            assert str(app.screen.query_one("#prompt-error").render()) == f"{existing}: already exists; choose a new file name"
        assert saved.read_text() == before

        await pilot.press("ctrl+a", "ctrl+k", *f"{saved}/p.json", "enter")  # below a file: the write fails
        await pilot.pause()
        assert not isinstance(app.screen, TextPrompt)
        [error] = notices(app, "error")
        assert error.startswith("Could not save the preset: ") and str(saved) in error

        await pilot.press("ctrl+s")
        await pilot.pause()
        await pilot.press("ctrl+a", "ctrl+k", *"p.json", "enter")
        await pilot.pause()
        assert json.loads((tmp_path / "p.json").read_text())["steps"] == 123 and "Saved preset p.json" in notices(app)


async def test_loading_a_preset_needs_no_file_it_was_built_on(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save_json(tmp_path / "base.json", to_dict(parse_train_config(["--steps=77"])))
    save_json(tmp_path / "preset.json", to_dict(parse_train_config(["--config_path=base.json", "--seed=5"])))
    (tmp_path / "base.json").unlink()  # as for a config_path relative to another folder
    app = LrApp(plan_runner=None)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        view = app.query_one(LaunchView)
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("ctrl+a", "ctrl+k", *"preset.json", "enter")
        await pilot.pause()
        assert notices(app) == ["Loaded preset preset.json"]
        assert view.rows["steps"].value == "77" and view.rows["extra"].value == "--seed=5"
        assert view.plan.ok and view.plan.cfg is not None and (view.plan.cfg.steps, view.plan.cfg.seed) == (77, 5)


async def test_loading_a_resumed_runs_config_reads_neither_resume_nor_its_older_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = Path("runs/A")
    older = make_checkpoint(run, 100)
    point_last(run, 100)
    # what a resumed run saves in its checkpoints: resume true, config_path the checkpoint it resumed
    resumed = parse_train_config([f"--config_path={older}", "--resume=true", "--steps=500", "--log_freq=7"])
    assert resumed.resume and resumed.config_path is not None
    saved = run / "checkpoints" / "000200" / "pretrained_model" / "train_config.json"
    save_json(saved, to_dict(resumed))
    app = LrApp(plan_runner=None)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        view = app.query_one(LaunchView)
        await pilot.press("ctrl+o")
        await pilot.pause()
        await pilot.press("ctrl+a", "ctrl+k", *str(saved), "enter")
        await pilot.pause()
        assert notices(app) == [f"Loaded preset {saved}"]
        assert view.rows["extra"].value == "--log_freq=7"  # no --config_path, no --resume
        assert view.rows["steps"].value == "500" and view.rows["batch_size"].value == "8"
        assert view.rows["output_dir"].value == str(tmp_path / run)
        assert view.plan.cfg == replace(resumed, resume=False, config_path=None)
        assert "--resume" not in panel_text(app, "#preview") and "--config_path" not in panel_text(app, "#preview")


async def test_a_plugin_policy_is_in_the_list_and_its_flags_complete():
    """The example plugin (`lr-tinyformer`, installed by the workspace) is a policy type of the
    form: chosen, the command asks for it; its own flags complete in "more flags"."""
    planner = FakePlanner()
    app = LrApp(plan_runner=planner, plan_delay=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        rows = app.launch_view.rows
        assert [value for _, value in rows["policy_type"].field.options] == ["", "act", "mlp", "tinyformer"]
        await wait_until(pilot, lambda: static_text(app, "#policy-flags").startswith("policy act"), what="ACT's settings")
        assert static_text(app, "#policy-flags") == "policy act (demo preset): chunk_size=10 n_action_steps=10 dim_model=128 vision_backbone=resnet18 (+16 in --help)"
        rows["policy_type"].set_value("tinyformer")
        await wait_until(pilot, lambda: "tinyformer" in static_text(app, "#policy-flags"), what="the plugin's settings")
        assert static_text(app, "#policy-flags") == "policy tinyformer: chunk_size=8 n_action_steps=8 dim_model=64 n_heads=4 (+4 in --help)"
        await type_into(pilot, "extra", "--policy.n_bl")
        field = app.query_one("#field-extra")
        await wait_until(pilot, lambda: field._suggestion == "--policy.n_blocks=", what="the flag's completion")
        await pilot.press("right", "3")
        assert field.value == "--policy.n_blocks=3"
        await wait_until(pilot, lambda: "--policy.n_blocks=3" in panel_text(app, "#preview"), what="the command")
        command = panel_text(app, "#preview")
        assert "--policy.type=tinyformer" in command
        await wait_until(pilot, lambda: bool(planner.calls) and "--policy.n_blocks=3" in planner.calls[-1], what="the plan")
        assert "--policy.type=tinyformer" in planner.calls[-1]


POINTMASS = Path(__file__).resolve().parents[3] / "packages" / "lr-engine" / "tests" / "data" / "lerobot_reference" / "dataset_pointmass_video"
"""The video dataset LeRobot 0.6.1 wrote (4 episodes, a 48x64 AV1 camera, state 4, environment 2, action 2)."""


def cached_hub_dataset(cache: Path, repo_id: str, info: dict) -> str:  # type: ignore[type-arg]
    """A dataset's meta/info.json in a Hugging Face hub cache, as huggingface_hub lays it out; its commit."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    folder = cache / f"datasets--{repo_id.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    meta = folder / "snapshots" / commit / "meta"
    meta.mkdir(parents=True)
    (meta / "info.json").write_text(json.dumps(info))
    return commit


async def test_the_dataset_fields_complete_and_show_what_the_dataset_holds(tmp_path, monkeypatch):
    """A local video dataset, a cached Hub one (completed from the cache), one still to download,
    and a local one with a feature no lr policy takes: the panel under the dataset fields says
    where each is and what meta/info.json holds, without torch or the network."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "lerobot"))
    info = json.loads((POINTMASS / "meta" / "info.json").read_text())
    commit = cached_hub_dataset(tmp_path / "hub", "lr-test/pointmass", info)
    odd = tmp_path / "odd"
    (odd / "meta").mkdir(parents=True)
    extra = {**info["features"], "observation.velocity": {"dtype": "float32", "shape": [2], "names": None}}
    (odd / "meta" / "info.json").write_text(json.dumps({**info, "features": extra}))
    app = LrApp(plan_runner=FakePlanner(), plan_delay=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        rows = app.launch_view.rows

        def shown() -> str:
            return static_text(app, "#dataset-info")

        rows["dataset_root"].set_value(str(POINTMASS))
        await wait_until(pilot, lambda: "local folder" in shown(), what="the local dataset")
        assert shown().splitlines()[1:] == ["4 episodes, 120 frames, 10 fps", "state 4; env 2; camera top 48x64 av1; action 2"]

        rows["dataset_root"].set_value("")
        await type_into(pilot, "dataset_repo_id", "lr-test/p")
        field = app.query_one("#field-dataset_repo_id")
        await wait_until(pilot, lambda: field._suggestion == "lr-test/pointmass", what="the cached id's completion")
        await pilot.press("right")
        await wait_until(pilot, lambda: "cached from the Hub" in shown(), what="the cached dataset")
        assert f"(commit {commit[:12]})" in shown() and "4 episodes, 120 frames, 10 fps" in shown()

        rows["dataset_repo_id"].set_value("someone/elsewhere")
        await wait_until(pilot, lambda: "not on this machine" in shown(), what="a dataset to download")
        assert shown() == "not on this machine: someone/elsewhere is downloaded from the Hub when the run starts"

        rows["dataset_root"].set_value(str(odd))
        await wait_until(pilot, lambda: "not taken" in static_text(app, "#dataset-problems"), what="the flagged feature")
        assert static_text(app, "#dataset-problems") == "not taken by lr's policies (ignored): observation.velocity"
