"""The heavy work of the TUI, as subprocesses of lr's CLIs (argv lists, never a shell).

The TUI never imports torch: plans, conversions, verification, publishing and training
run as `sys.executable -m <package>.cli ...` (the same interpreter, so it works inside the
venv). `run_streaming` runs one and hands each output line to a callback; cancelling it
kills the child's whole process group. `start_training` starts a launch command detached
in its own session (it outlives the TUI), its stdout and stderr going to
`<output_dir>/logs/launch.log`, and records the launcher in `logs/launch.json`.

`launch_argv` is what the TUI runs (and shows, and copies) for an lr-config launch argv: the
launcher at this environment's own path (`resolve_executable`: the `torchrun` or
`accelerate` beside this interpreter, where `uv run lr-tui` puts it, else the one on PATH),
so the command runs as shown from any shell, venv activated or not; and, once the output dir
is known, the per-rank log options of `with_rank_logs`.

`with_rank_logs` adds the launcher options that make that log readable per rank: `--tee=3`
with `--log-dir=<output_dir>/logs/ranks` (each rank's own stdout/stderr files), and under
torchrun `--log-line-prefix-template=[rank${rank}]:`, so every console line of a worker
starts with its global rank (accelerate launch keeps torchrun's `[default<local rank>]:`).
A launch also gets `TORCH_ELASTIC_SHUTDOWN_TIMEOUT` longer than the TUI's stop grace:
torchrun would otherwise SIGKILL the workers 30 s after passing on a stop, even in the
middle of the final checkpoint; the TUI's grace decides instead (see run_control).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from ._run_control import write_launch_record

__all__ = [
    "CONVERT_DTYPES",
    "LAUNCH_LOG",
    "LAUNCHERS",
    "cli_argv",
    "convert_argv",
    "launch_argv",
    "plan_argv",
    "publish_argv",
    "resolve_executable",
    "shown_command",
    "run_streaming",
    "start_training",
    "verify_argv",
    "with_rank_logs",
]

LAUNCH_LOG = Path("logs") / "launch.log"
RANK_LOGS = Path("logs") / "ranks"
RANK_PREFIX = "[rank${rank}]:"
CONVERT_DTYPES = ("fp32", "bf16", "fp16")
LAUNCHERS = ("torchrun", "accelerate")
"""The launchers lr-config's commands start with (bare names: on PATH only in an activated venv)."""


def cli_argv(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def plan_argv(dry_run_flags: list[str]) -> list[str]:
    """`lr-engine train --dry_run=true --world_size=N <flags>`."""
    return cli_argv("lr_engine.cli", "train", *dry_run_flags)


def convert_argv(step_dir: Path, dtype: str, *, overwrite: bool = False) -> list[str]:
    argv = cli_argv("lr_checkpoint.cli", "convert", str(step_dir), f"--dtype={dtype}")
    return argv + ["--overwrite=true"] if overwrite else argv


def verify_argv(step_dir: Path) -> list[str]:
    return cli_argv("lr_checkpoint.cli", "verify", str(step_dir))


def publish_argv(step_dir: Path, repo_id: str) -> list[str]:
    return cli_argv("lr_publish.cli", f"--checkpoint_dir={step_dir}", f"--repo_id={repo_id}")


_SCRIPTS = {"lr_checkpoint.cli": "lr-checkpoint", "lr_publish.cli": "lr-publish", "lr_engine.cli": "lr-engine"}


def shown_command(argv: list[str]) -> str:
    """The command `argv` runs, as a person would type it: `python -m lr_checkpoint.cli` is the
    `lr-checkpoint` console script of the same environment; every argument is shown as passed."""
    if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m" and argv[2] in _SCRIPTS:
        return shlex.join([_SCRIPTS[argv[2]], *argv[3:]])
    return shlex.join(argv)


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


async def run_streaming(argv: list[str], on_line: Callable[[str], None]) -> int:
    """Run argv, passing each stdout/stderr line to `on_line`; return the exit code."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=_child_env(),
        start_new_session=True,
        limit=4 * 1024 * 1024,
    )
    assert proc.stdout is not None
    try:
        async for raw in proc.stdout:
            on_line(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
        return await proc.wait()
    except asyncio.CancelledError:
        _kill_group(proc.pid)
        await proc.wait()
        raise


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def resolve_executable(name: str) -> str:
    """`torchrun`/`accelerate` from this interpreter's venv first, then PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name) or name


def _launcher(argv: list[str]) -> str:
    """`torchrun`, `accelerate` or '' for the program of `argv` (a bare name or a path to one)."""
    name = Path(argv[0]).name if argv else ""
    return name if name in LAUNCHERS else ""


def with_rank_logs(argv: list[str], output_dir: Path) -> list[str]:
    """`argv` with every rank's output tee'd to `<output_dir>/logs/ranks` and rank-prefixed."""
    log_dir = str(Path(output_dir) / RANK_LOGS)
    launcher = _launcher(argv)
    if launcher == "torchrun":
        return [argv[0], "--tee=3", f"--log-dir={log_dir}", f"--log-line-prefix-template={RANK_PREFIX}", *argv[1:]]
    if launcher == "accelerate" and argv[1:2] == ["launch"]:
        return [*argv[:2], "--tee=3", f"--log_dir={log_dir}", *argv[2:]]
    return argv


def launch_argv(argv: list[str], output_dir: Path | None = None) -> list[str]:
    """What the TUI runs, shows and copies for lr-config's launch `argv`: the per-rank log options
    once `output_dir` is known, and the launcher at the path that runs (`resolve_executable`)."""
    if output_dir is not None:
        argv = with_rank_logs(argv, output_dir)
    if argv and argv[0] in LAUNCHERS:
        argv = [resolve_executable(argv[0]), *argv[1:]]
    return argv


def start_training(
    argv: list[str], output_dir: Path, *, stop_grace: float = 30.0, extra_env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start `argv` in a new session; output to `<output_dir>/logs/launch.log` (appended). A bare
    launcher name runs from this environment (`resolve_executable`); `launch_argv` gives the path."""
    log_path = Path(output_dir) / LAUNCH_LOG
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**_child_env(), "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(int(stop_grace) + 60), **(extra_env or {})}
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [argv[0] if os.sep in argv[0] else resolve_executable(argv[0]), *argv[1:]],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    write_launch_record(output_dir, proc.pid, argv)
    return proc
