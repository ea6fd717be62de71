"""The README's "first hour", run as typed (with `uv run <command>` as this environment's own
command): two processes on the demo, Ctrl+C, verify and convert the stopped checkpoint, resume it
on one process. Each step checks what the README says it does."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _support.procs import subprocess_env

pytestmark = pytest.mark.multiprocess

README = Path(__file__).resolve().parents[1] / "README.md"
MODULES = {"lr-engine": "lr_engine.cli", "lr-checkpoint": "lr_checkpoint.cli", "lr-tui": "lr_tui"}


def first_hour_commands() -> list[list[str]]:
    """The `uv run ...` commands of the README's first-hour block, continuation lines joined."""
    block = README.read_text().split("## Your first hour", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    text = re.sub(r"\\\n\s*", " ", block)
    return [shlex.split(line.split("#", 1)[0]) for line in text.splitlines() if line.startswith("uv run ")]


def as_run_here(argv: list[str]) -> list[str]:
    assert argv[:2] == ["uv", "run"], argv
    return [sys.executable, "-m", MODULES[argv[2]], *argv[3:]]


def test_the_first_hour_runs_as_written(tmp_path: Path) -> None:
    commands = first_hour_commands()
    assert [c[2:4] for c in commands] == [["lr-engine", "launch"], ["lr-checkpoint", "verify"], ["lr-checkpoint", "convert"],
                                          ["lr-engine", "train"], ["lr-tui", "outputs/first"]]
    env = subprocess_env({"LR_CACHE_DIR": str(tmp_path / "cache")})
    out = tmp_path / "outputs" / "first"

    # 1-2: two processes, Ctrl+C after a few log lines: exit 3, the resume command last
    launch = subprocess.Popen(as_run_here(commands[0]), cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        assert launch.stdout is not None
        deadline, lines = time.monotonic() + 300, []
        while sum(line.startswith("step ") for line in lines) < 2:
            assert time.monotonic() < deadline and (line := launch.stdout.readline()), "".join(lines)
            lines.append(line)
        os.killpg(launch.pid, signal.SIGINT)
        rest, stderr = launch.communicate(timeout=180)
    finally:
        if launch.poll() is None:
            os.killpg(launch.pid, signal.SIGKILL)
    assert launch.returncode == 3 and "Traceback" not in stderr, stderr[-3000:]  # lr-engine launch: the workers' "stopped"
    assert rest.strip().splitlines()[-1] == (
        "resume with: lr-engine launch --nproc-per-node=2 train --resume=true --config_path=outputs/first/checkpoints/last"
    )
    status = json.loads((out / "run.json").read_text())
    stopped = status["step"]
    assert status["status"] == "stopped" and os.readlink(out / "checkpoints" / "last") == f"{stopped:06d}"

    # 3: verify, then convert the stopped DCP checkpoint into one model.safetensors
    for argv in commands[1:3]:
        done = subprocess.run(as_run_here(argv), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "checkpoints" / "last" / "pretrained_model" / "model.safetensors").is_file()

    # 4: resume on one process, no other flag: it reshards, says what changed, and finishes
    resumed = subprocess.run(as_run_here(commands[3]), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    warning = next(line for line in resumed.stdout.splitlines() if line.startswith("warning: resuming"))
    assert "world_size 2 -> 1" in warning and "layout fsdp2 -> single" in warning, warning
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "finished" and status["step"] == 100 > stopped
    assert json.loads((out / "checkpoints" / "last" / "training_state" / "training_step.json").read_text())["checkpoint_format"] == "safetensors"


def test_the_readmes_dry_run_commands_run_as_written(tmp_path: Path) -> None:
    """Every `uv run ... --dry_run=true ...` command the README shows plans without an error."""
    text = re.sub(r"\\\n\s*", " ", README.read_text())
    commands = [shlex.split(line.split("#", 1)[0]) for line in text.splitlines() if line.startswith("uv run ") and "--dry_run=true" in line]
    assert commands
    env = subprocess_env({"LR_CACHE_DIR": str(tmp_path / "cache")})
    for argv in commands:
        done = subprocess.run(as_run_here(argv), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (argv, done.stderr[-2000:])
        assert done.stdout.startswith("lr-engine dry run:"), done.stdout[:500]
