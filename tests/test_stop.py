"""Stopping a run, as a person at a terminal does it, on real processes.

- Ctrl+C (SIGINT to the foreground process group) while the reader of the run's stdout and
  stderr has gone away (`lr-engine train ... | tee log`, whose `tee` the same Ctrl+C kills):
  the run still stops cleanly, writes its stop checkpoint and says `stopped` in run.json, on
  one process (with DataLoader workers, which the same Ctrl+C reaches) and under torchrun on
  two.
- `lr-engine launch` (torchrun, quietly): a setting that does not fit is refused before any
  worker starts, a failed rank is named in one line last. (Its Ctrl+C, exit 3 and resume
  command: tests/test_readme.py, which runs the README's first hour as typed.)
- A clean stop exits 3 ("stopped, resumable"), not 0 ("finished") nor 1 ("failed"), and its
  last line is the command that resumes it; a finished run's last line says how to train it
  longer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _support.procs import run_cli, subprocess_env
from _support.runs import TINY

pytestmark = pytest.mark.multiprocess

EXIT_STOPPED = 3


def _command(nproc: int, *argv: str) -> list[str]:
    if nproc == 1:
        return [sys.executable, "-m", "lr_engine.cli", *argv]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "lr_engine.cli", *argv]


def _read_until_steps(proc: subprocess.Popen[bytes], count: int, timeout: float = 240) -> list[str]:
    """stdout's lines until `count` step lines were logged (the run trains)."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while sum(line.startswith("step ") for line in lines) < count:
        assert time.monotonic() < deadline, lines
        raw = proc.stdout.readline()
        assert raw, f"stdout closed before {count} steps (exit {proc.wait()}): {lines}"
        lines.append(raw.decode(errors="replace"))
    return lines


@pytest.mark.parametrize("nproc", [1, 2])
def test_ctrl_c_with_the_output_reader_gone_still_saves_the_stop_checkpoint(tmp_path: Path, demo_dataset: Path, nproc: int) -> None:
    from lr_checkpoint import verify_checkpoint

    out = tmp_path / "run"
    # one process: DataLoader workers too, which the same Ctrl+C reaches (they must leave the stop to the trainer)
    layout = ["--parallelism.dp_shard=2"] if nproc == 2 else ["--num_workers=2"]
    argv = _command(nproc, "train", f"--output_dir={out}", f"--dataset.root={demo_dataset}", *TINY, "--steps=100000",
                    "--save_freq=100000", *layout)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env(), start_new_session=True)
    try:
        _read_until_steps(proc, 2)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader goes away, as `tee` killed by the same Ctrl+C does
        proc.stderr.close()
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl+C: the terminal signals the whole foreground group
        code = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "stopped", status
    stopped = status["step"]
    last = out / "checkpoints" / "last"
    assert os.readlink(last) == f"{stopped:06d}"
    assert json.loads((last / "training_state" / "training_step.json").read_text())["step"] == stopped
    assert verify_checkpoint(last) == []
    if nproc == 1:
        assert code == EXIT_STOPPED
    else:
        # under plain torchrun the launcher itself was interrupted; the workers' code is what lr controls
        assert code != 0


def test_a_stop_exits_3_and_prints_the_resume_command_and_the_end_says_how_to_train_longer(tmp_path: Path, demo_dataset: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(_command(1, "train", f"--output_dir={out}", f"--dataset.root={demo_dataset}", *TINY, "--steps=100000",
                                     "--save_freq=100000"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env(), start_new_session=True)
    try:
        _read_until_steps(proc, 2)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_STOPPED, stderr[-3000:]
    last_line = stdout.decode().strip().splitlines()[-1]
    assert last_line == f"resume with: lr-engine train --resume=true --config_path={out / 'checkpoints' / 'last'}"
    assert "Traceback" not in stderr.decode()

    resumed = run_cli(["lr_engine.cli", "train", "--resume=true", f"--config_path={out / 'checkpoints' / 'last'}",
                       f"--steps={json.loads((out / 'run.json').read_text())['step'] + 2}"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    step = json.loads((out / "run.json").read_text())["step"]
    assert resumed.stdout.strip().splitlines()[-1] == (
        f"train longer with: lr-engine train --resume=true --config_path={out / 'checkpoints' / 'last'} --steps={2 * step}"
        f"   (any --steps above {step})"
    )


def _launch(*argv: str) -> list[str]:
    return [sys.executable, "-m", "lr_engine.cli", "launch", *argv]


def test_launch_refuses_a_topology_that_does_not_fit_before_starting_anything(tmp_path: Path, demo_dataset: Path) -> None:
    """`dp_shard=3` on 2 processes: lr's one message is the last line, and no worker started (under plain
    torchrun it is followed by torchrun's traceback)."""
    out = tmp_path / "run"
    proc = subprocess.run(_launch("--nproc-per-node=2", "train", f"--output_dir={out}", f"--dataset.root={demo_dataset}",
                                  "--parallelism.dp_shard=3"), env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "lr-engine: error: --parallelism.dp_replicate x --parallelism.dp_shard = 1 x 3 = 3, but 2 processes will run; make the "
        "product 2 (for example --parallelism.dp_shard=-1) or launch 3 processes"
    ]
    assert not out.exists()


def test_launch_names_the_rank_that_failed_last(tmp_path: Path, demo_dataset: Path) -> None:
    """A rank that raises: its traceback, then one launcher line naming it (not torchrun's failure table), exit 1."""
    proc = subprocess.run(_launch("--nproc-per-node=2", "train", f"--output_dir={tmp_path / 'run'}", f"--dataset.root={demo_dataset}",
                                  *TINY, "--steps=50", "--parallelism.dp_shard=2"),
                          env=subprocess_env({"LR_TEST_RAISE_AT_STEP": "3", "LR_TEST_RAISE_RANK": "1"}), capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 1
    assert "test fault injected on rank 1 at step 3" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "lr-engine launch: rank 1 failed first (RuntimeError: test fault injected on rank 1 at step 3"
    ), proc.stderr[-3000:]
    assert proc.stderr.strip().endswith("); its error is above, and the other ranks were stopped")
    assert "Root Cause" not in proc.stderr
