"""Real `lr-engine train` runs started the way the TUI starts them, for tests and captures.

`launch(nproc, flags, output_dir)` builds the command with lr-config (`build_launch`) plus
the TUI's per-rank log options, and starts it with `cli_tasks.start_training`: its own
session, output in `<output_dir>/logs/launch.log`, launcher recorded in `logs/launch.json`.
`worker_pid(launcher, rank)` finds a rank's process by its RANK environment variable, so
a test can kill or stop exactly that rank. The tiny ACT of `TINY` steps in well under a
second on a loaded CPU.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lr_config import LaunchSpec, build_launch, parse_train_config
from lr_tui._cli_tasks import LAUNCH_LOG, start_training, with_rank_logs
from lr_tui._procs import descendants, signal_group

TINY = ["--policy.dim_model=32", "--policy.dim_feedforward=64", "--policy.n_heads=2", "--batch_size=8", "--log_freq=5"]


def make_tiny_dataset(root: Path) -> Path:
    """The demo dataset with 4 episodes, made in a subprocess (this process never imports torch)."""
    code = "import sys; from lr_engine import make_demo_dataset; make_demo_dataset(sys.argv[1], num_episodes=4)"
    subprocess.run([sys.executable, "-c", code, str(root)], check=True, timeout=300, env=quiet_env())
    return root


def quiet_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_"))}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def launch_argv(nproc: int, flags: list[str], output_dir: Path) -> list[str]:
    cfg = parse_train_config([f"--output_dir={output_dir}", *flags])
    return with_rank_logs(build_launch(LaunchSpec(nproc_per_node=nproc), cfg), output_dir)


def launch(nproc: int, flags: list[str], output_dir: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a real run as the TUI does; `env` adds variables for the launch (and its workers)."""
    return start_training(launch_argv(nproc, flags, output_dir), output_dir, extra_env={"OMP_NUM_THREADS": "1", **(env or {})})


def log_text(output_dir: Path) -> str:
    path = Path(output_dir) / LAUNCH_LOG
    return path.read_text(errors="replace") if path.exists() else ""


def wait_for_log(output_dir: Path, needle: str, proc: subprocess.Popen[bytes] | None = None, timeout: float = 240) -> str:
    """The log once it contains `needle`; fails if `proc` ends first or time runs out."""
    deadline = time.monotonic() + timeout
    while needle not in (text := log_text(output_dir)):
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the launch ended (exit {proc.returncode}) before {needle!r}:\n{text[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {needle!r} in the log after {timeout}s:\n{text[-3000:]}")
        time.sleep(0.2)
    return text


def worker_pid(launcher_pid: int, rank: int) -> int:
    """The pid of the worker with RANK=`rank` below the launcher."""
    for proc in descendants(launcher_pid):
        try:
            environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ:
            return proc.pid
    raise AssertionError(f"no worker with RANK={rank} below {launcher_pid}")


def end(launcher_pid: int) -> None:
    """SIGKILL a launch and every process below it, if any is left (test clean-up)."""
    for child in descendants(launcher_pid):
        signal_group(child.pgid, signal.SIGKILL)
    signal_group(launcher_pid, signal.SIGKILL)
