"""Pilot tests of the Checkpoints view: the table from files, details, and the actions."""

from __future__ import annotations

import importlib.util
import re
import shlex
import struct
import sys
from pathlib import Path

import pytest
from _support.runs import TinyRun, copy_run
from tui_support import app_ready, make_checkpoint, point_last, wait_until, write_run_status

from lr_config import LaunchSpec, build_resume_launch, format_command
from lr_tui import _cli_tasks as cli_tasks
from lr_tui._app import LrApp
from lr_tui._screens.resume import ResumeScreen
from lr_tui._views import checkpoints as checkpoints_view
from lr_tui._widgets.text_panel import TextPanel

pytestmark = pytest.mark.asyncio
SIZE = (100, 30)


def table_rows(app: LrApp) -> list[list[str]]:
    table = app.query_one("#ckpt-table")
    return [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]


def output(app: LrApp) -> str:
    return app.query_one("#ckpt-output", TextPanel).text


async def open_checkpoints(pilot) -> None:  # type: ignore[no-untyped-def]
    await app_ready(pilot)
    await pilot.press("3")
    await pilot.pause()


async def test_table_lists_step_dirs_and_details_come_from_headers(tmp_path):
    make_checkpoint(tmp_path, 100, checkpoint_format="safetensors_dcp", fake_dcp=True)
    make_checkpoint(tmp_path, 200, checkpoint_format="dcp", weights=None, fake_dcp=True, precision="fp16")
    (tmp_path / "checkpoints" / ".tmp-000300-x").mkdir()
    point_last(tmp_path, 200)
    app = LrApp(tmp_path, plan_runner=None)
    async with app.run_test(size=SIZE) as pilot:
        await open_checkpoints(pilot)
        rows = table_rows(app)
        assert [r[:4] + r[5:] for r in rows] == [
            ["000100", "safetensors_dcp", "fsdp2 1x2", "bf16", "model", "yes", ""],
            ["000200", "dcp", "fsdp2 1x2", "fp16", "-", "yes", "last"],
        ]
        assert app.focused is app.query_one("#ckpt-table")
        details = app.query_one("#ckpt-details", TextPanel)
        # it opens on the checkpoint `last` points to, not on the oldest
        assert app.checkpoints_view.selected().name == "000200" and details.border_title == "details: 000200"
        assert details.text.splitlines()[2:4] == ["batch 8 x dp_world 2 x grad_accum 1", "precision fp16, saved as dcp"]
        await pilot.press("up")
        await pilot.pause()
        assert details.border_title == "details: 000100"
        assert "             4 tensors (4 F32), 2.6 KB of data" in details.text.splitlines()
        assert "     3.9 KB  pytorch_model_fsdp_0/  3 files" in details.text.splitlines()
        assert "precision bf16, saved as safetensors_dcp" in details.text.splitlines()


async def test_it_opens_on_last_again_for_another_run_but_keeps_the_choice_on_refresh(tmp_path):
    for run, last in (("a", 100), ("b", 300)):
        for step in (100, 200, 300):
            make_checkpoint(tmp_path / run, step)
        point_last(tmp_path / run, last)
    app = LrApp(tmp_path / "a", plan_runner=None)
    async with app.run_test(size=SIZE) as pilot:
        await open_checkpoints(pilot)
        view = app.checkpoints_view
        assert view.selected().name == "000100"  # a's last is its oldest
        await pilot.press("down")
        await pilot.press("f5")
        await pilot.pause()
        assert view.selected().name == "000200"  # a refresh keeps the row chosen
        app.open_run(tmp_path / "b")
        await pilot.pause()
        assert view.selected().name == "000300"


async def test_resume_opens_the_resume_screen_of_the_selected_checkpoint_and_launches_it(tmp_path, monkeypatch):
    """r resumes the checkpoint selected (here not the last one): the resume screen with its
    fields, the command to copy, and ctrl+r launches it into the run folder, watched in the Monitor."""
    fake = tmp_path / "bin" / "torchrun"  # stands in for torchrun: prints its argv
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport sys\nprint('fake torchrun', *sys.argv[1:])\n")
    fake.chmod(0o755)
    monkeypatch.setattr(cli_tasks, "resolve_executable", lambda name: str(fake) if name == "torchrun" else name)
    run = tmp_path / "run"
    older = make_checkpoint(run, 100, batch_size=8)
    make_checkpoint(run, 200, batch_size=8)
    point_last(run, 200)
    write_run_status(run, status="stopped", step=200, steps=300)
    app = LrApp(run, plan_runner=None, poll_interval=0.05)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        app.launch_view.rows["nproc_per_node"].set_value("4")  # the form's process count is not the checkpoint's
        await open_checkpoints(pilot)
        await pilot.press("up", "r")
        await wait_until(pilot, lambda: isinstance(app.screen, ResumeScreen), what="the resume screen")
        screen = app.screen
        assert isinstance(screen, ResumeScreen) and screen.step_dir == older.absolute() and not screen.is_last
        assert str(screen.query_one("#resume-saved").render()).startswith("000100: step 100, FSDP2 dp_replicate=1 dp_shard=2 world=2")
        assert screen.query_one("#resume-nproc-per-node").value == "2"  # type: ignore[attr-defined]
        expected = build_resume_launch(LaunchSpec(nproc_per_node=2), older.absolute(), [])
        assert screen.plan is not None and screen.plan.argv is not None
        assert screen.plan.argv[-3:] == expected[-3:] and screen.plan.argv[0] == str(fake)
        assert str(screen.query_one("#resume-exact").render()) == "sample-exact: yes (batch 8 x dp 2 = 16, as saved)"
        await pilot.press("ctrl+y")
        assert app.clipboard == format_command(screen.plan.argv) == screen.query_one("#resume-command", TextPanel).text
        await pilot.press("ctrl+r")
        await pilot.pause()
        monitor = app.monitor_view
        assert app.query_one("#views").active == "monitor" and monitor.run_dir == run and monitor.process is not None
        assert monitor.process.wait(timeout=60) == 0
        await wait_until(pilot, lambda: "fake torchrun" in (run / "logs" / "launch.log").read_text(), what="the launch")
        launched = (run / "logs" / "launch.log").read_text()
        assert f"--config_path={older.absolute()}/pretrained_model/train_config.json" in launched and "--resume=true" in launched


async def test_publish_asks_for_a_valid_repo_id_then_runs_the_cli(tmp_path, monkeypatch):
    step_dir = make_checkpoint(tmp_path, 100)
    seen: list[tuple[Path, str]] = []

    def stand_in(path: Path, repo_id: str) -> list[str]:
        seen.append((path, repo_id))
        return [sys.executable, "-c", f"print('pushed to {repo_id}')"]

    monkeypatch.setattr(checkpoints_view, "publish_argv", stand_in)
    app = LrApp(tmp_path, plan_runner=None)
    async with app.run_test(size=SIZE) as pilot:
        await open_checkpoints(pilot)
        await pilot.press("p", *"bad..id")
        await pilot.pause()
        assert str(app.screen.query_one("#prompt-error").render()).startswith("repo id: 'bad..id' is not a valid Hub repo id")
        await pilot.press("enter")  # refused while invalid
        assert seen == []
        await pilot.press(*["backspace"] * 7, *"me/act", "enter")
        await wait_until(pilot, lambda: "done" in output(app), what="the publish task")
        assert seen == [(step_dir, "me/act")]
        assert output(app).splitlines()[1:] == ["pushed to me/act", "lr-publish 000100 --repo_id=me/act: done"]


async def test_verify_streams_the_cli_output_and_reports_failure(tmp_path, monkeypatch):
    make_checkpoint(tmp_path, 100)
    script = "import sys; print('checking', sys.argv[1]); print('shard 3 missing'); sys.exit(2)"
    monkeypatch.setattr(checkpoints_view, "verify_argv", lambda path: [sys.executable, "-c", script, path.name])
    app = LrApp(tmp_path, plan_runner=None)
    async with app.run_test(size=SIZE) as pilot:
        await open_checkpoints(pilot)
        await pilot.press("v")
        await wait_until(pilot, lambda: "failed" in output(app), what="the verify task")
        assert output(app).splitlines() == [
            f"$ {shlex.join([sys.executable, '-c', script, '000100'])}",  # what runs, exactly
            "checking 000100",
            "shard 3 missing",
            "lr-checkpoint verify 000100: failed (exit 2)",
        ]
        assert app.query_one("#ckpt-output").has_class("-error")


async def test_a_running_task_counts_its_seconds(tmp_path, monkeypatch):
    """A verify (convert, publish) that takes over a second: the output panel says it is running, and for how long."""
    make_checkpoint(tmp_path, 100)
    script = "import time; print('checking', flush=True); time.sleep(2.5); print('ok')"
    monkeypatch.setattr(checkpoints_view, "verify_argv", lambda path: [sys.executable, "-c", script])
    app = LrApp(tmp_path, plan_runner=None)
    async with app.run_test(size=SIZE) as pilot:
        await open_checkpoints(pilot)
        panel = app.query_one("#ckpt-output", TextPanel)
        running = re.compile(r"running: (\d+) s")

        def seconds() -> int:
            match = running.fullmatch(panel.border_subtitle)
            return int(match.group(1)) if match else -1

        await pilot.press("v")
        await wait_until(pilot, lambda: seconds() >= 0, what="the task to start")
        first = seconds()
        await wait_until(pilot, lambda: "checking" in output(app), what="its first line")
        assert seconds() >= first  # a line of output keeps the count
        await wait_until(pilot, lambda: seconds() > first, what="a second to be counted")
        await wait_until(pilot, lambda: "done" in output(app), what="the end")
        assert panel.border_subtitle.startswith("done in ") and panel.border_subtitle.endswith(" s")


def flip_tensor_bytes(path: Path) -> None:
    """Flip a few bytes inside the tensor data of a safetensors file: its header still parses,
    its checksum no longer matches the one the save wrote."""
    data = bytearray(path.read_bytes())
    start = 8 + struct.unpack("<Q", data[:8])[0] + 64
    data[start : start + 4] = bytes(b ^ 0xFF for b in data[start : start + 4])
    path.write_bytes(data)


def last_line_starts(app: LrApp, prefix: str) -> bool:
    lines = output(app).splitlines()
    return bool(lines) and lines[-1].startswith(prefix)


async def test_verify_runs_the_real_cli_and_names_the_damaged_file(tiny_run: TinyRun, tmp_path):
    """The real `lr-checkpoint verify` subprocess on a copy of a real trained run whose 000004
    model.safetensors has bytes flipped in its tensor data (its checksum no longer matches)."""
    run = copy_run(tiny_run, tmp_path / "run")
    damaged = run / "checkpoints" / "000004" / "pretrained_model" / "model.safetensors"
    flip_tensor_bytes(damaged)
    app = LrApp(run, plan_runner=None)
    async with app.run_test(size=SIZE) as pilot:
        await open_checkpoints(pilot)
        assert [row[0] for row in table_rows(app)] == ["000002", "000004"]
        await pilot.press("down", "v")
        await wait_until(pilot, lambda: last_line_starts(app, "lr-checkpoint verify 000004: "), timeout=120, what="verify 000004")
        lines = output(app).splitlines()
        assert lines[0] == f"$ lr-checkpoint verify {run / 'checkpoints' / '000004'}"  # exactly what runs
        assert f"PROBLEM: {damaged}: its bytes differ from the save (its checksum does not match checksums.json); " \
            "the file is damaged: resume from another checkpoint" in lines, lines
        assert f"1 problem(s) in {damaged.parents[1]}" in lines
        assert lines[-1] == "lr-checkpoint verify 000004: failed (exit 1)"
        assert app.query_one("#ckpt-output").has_class("-error")
        assert not any("000002" in line for line in lines)  # the damage is in 000004 only


async def test_publish_pushes_the_real_checkpoint_to_the_hub(tiny_run: TinyRun, hub_server, tmp_path, monkeypatch):
    """The real `lr-publish` subprocess pushes 000004 of a copy of a real trained run to the
    loopback Hub (it finds the Hub and the token in the environment the TUI passes on)."""
    token = "hf_lrTuiPublishTest0123456789"
    monkeypatch.setenv("HF_ENDPOINT", hub_server.endpoint)
    monkeypatch.setenv("HF_TOKEN", token)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("LR_HUB_RETRY_BASE_S", "0.01")
    hub_server.require_token(token)
    run = copy_run(tiny_run, tmp_path / "run")
    pretrained = run / "checkpoints" / "000004" / "pretrained_model"
    app = LrApp(run, plan_runner=None)
    async with app.run_test(size=SIZE) as pilot:
        await open_checkpoints(pilot)
        await pilot.press("down", "p", *"me/tinyact", "enter")
        await wait_until(pilot, lambda: last_line_starts(app, "lr-publish 000004 --repo_id=me/tinyact: "), timeout=120, what="the publish")
        lines = output(app).splitlines()
        assert lines[0] == f"$ lr-publish --checkpoint_dir={pretrained.parent} --repo_id=me/tinyact"
        assert f"Model pushed to {hub_server.endpoint}/me/tinyact" in lines, lines
        assert lines[-1] == "lr-publish 000004 --repo_id=me/tinyact: done"
        assert not app.query_one("#ckpt-output").has_class("-error")

    uploaded = hub_server.files("me/tinyact")
    saved = {p.name: p.read_bytes() for p in pretrained.iterdir()}
    assert {"model.safetensors", "config.json", "train_config.json", "policy_preprocessor.json"} <= set(saved)
    assert set(uploaded) == set(saved) | {"README.md"}
    assert {name: data for name, data in uploaded.items() if name != "README.md"} == saved  # byte for byte
    assert token.encode() not in uploaded["README.md"]


def _save_real_dcp(step_dir: Path) -> dict[str, object]:
    import torch
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    state = {"model.encoder.weight": torch.randn(16, 8), "model.encoder.bias": torch.randn(16), "model.head.weight": torch.randn(4, 16)}
    dcp.save(state, checkpoint_id=step_dir / "pretrained_model" / "pytorch_model_fsdp_0")
    return state


@pytest.mark.skipif(importlib.util.find_spec("lr_checkpoint.cli") is None, reason="lr-checkpoint convert not available")
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
async def test_convert_turns_real_dcp_shards_into_model_safetensors(tmp_path):
    step_dir = make_checkpoint(tmp_path, 100, checkpoint_format="dcp", weights=None)
    state = _save_real_dcp(step_dir)
    app = LrApp(tmp_path, plan_runner=None)
    async with app.run_test(size=SIZE) as pilot:
        await open_checkpoints(pilot)
        assert table_rows(app)[0][5] == "-"
        await pilot.press("c")
        await pilot.pause()
        await pilot.press("enter")  # fp32, the first choice
        await wait_until(pilot, lambda: "done" in output(app) or "failed" in output(app), timeout=120, what="the convert task")
        assert output(app).splitlines()[-1] == "lr-checkpoint convert 000100 --dtype=fp32: done", output(app)
        assert table_rows(app)[0][5] == "model"
        details = app.query_one("#ckpt-details", TextPanel).text
        assert f"             3 tensors (3 F32), {(16 * 8 + 16 + 4 * 16) * 4} B of data" in details.splitlines()

    from safetensors.numpy import load_file

    converted = load_file(str(step_dir / "pretrained_model" / "model.safetensors"))
    assert set(converted) == set(state)
    for key, tensor in state.items():
        assert (converted[key] == tensor.numpy()).all()  # type: ignore[attr-defined]
