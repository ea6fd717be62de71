"""Pilot tests of the Checkpoints view: the table from files, details, and the actions."""

from __future__ import annotations

import importlib.util
import struct
import sys
from pathlib import Path

import pytest
from _support.runs import TinyRun, copy_run
from tui_support import app_ready, make_checkpoint, point_last, wait_until

from lr_config import LaunchSpec, build_resume_launch, format_command
from lr_tui._app import LrApp
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
        assert "             4 tensors (4 F32), 2.6 KB of data" in details.text.splitlines()
        assert "     3.9 KB  pytorch_model_fsdp_0/  3 files" in details.text.splitlines()
        await pilot.press("down")
        await pilot.pause()
        assert details.border_title == "details: 000200"
        assert details.text.splitlines()[2] == "batch 8 x dp_world 2 x grad_accum 1, fp16"


async def test_copy_resume_command_uses_the_launch_form_and_says_if_it_is_sample_exact(tmp_path):
    step_dir = make_checkpoint(tmp_path, 100, batch_size=8)
    app = LrApp(tmp_path, plan_runner=None)
    async with app.run_test(size=SIZE) as pilot:
        await app_ready(pilot)
        launch = app.launch_view
        launch.rows["nproc_per_node"].set_value("4")
        launch.rows["dp_shard"].set_value("-1")
        await open_checkpoints(pilot)
        await pilot.press("r")
        await pilot.pause()
        expected = format_command(build_resume_launch(LaunchSpec(nproc_per_node=4), step_dir.absolute(), ["--parallelism.dp_shard=-1"]))
        assert app.clipboard == expected
        assert output(app).splitlines()[-1] == "sample-exact: no (batch 8 x dp 2 -> 8 x dp 4); resumes at the right epoch and offset"

        launch.rows["nproc_per_node"].set_value("2")
        await pilot.press("r")
        await pilot.pause()
        assert output(app).splitlines()[-1] == "sample-exact: yes (batch 8 x dp 2 = 16, as saved)"

        launch.rows["dp_shard"].set_value("")
        launch.rows["nproc_per_node"].set_value("3")
        await pilot.press("r")
        await pilot.pause()
        assert output(app).startswith("cannot resume 000100 with 3 process(es):\n--parallelism.dp_replicate x --parallelism.dp_shard")


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
            "$ lr-checkpoint verify 000100",
            "checking 000100",
            "shard 3 missing",
            "lr-checkpoint verify 000100: failed (exit 2)",
        ]
        assert app.query_one("#ckpt-output").has_class("-error")


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
        assert lines[0] == "$ lr-checkpoint verify 000004"
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
        assert lines[0] == "$ lr-publish 000004 --repo_id=me/tinyact"
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
