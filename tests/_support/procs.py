"""Real processes for the tests: CLIs, jobs of several ranks, torchrun.

`run_cli(argv)` runs one of our console entry points as a process of its own and returns the
CompletedProcess. `run_ranks(nproc, argv, ...)` starts the N worker processes of a job without
torchrun's agent: each gets the environment torchrun gives its workers (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), their output is merged as under
torchrun, and when one fails the others get SIGTERM, then SIGKILL 30 s later, as torchrun does
it. Both fork their processes from a server that has imported torch once (`forkserver.py`):
a plain start spends 4 to 6 s of one core on `import torch` before the CLI does anything, and
torchrun's agent one more import before any worker starts. `run_torchrun(nproc, argv, ...)`
starts `python -m torch.distributed.run --standalone --nproc-per-node=N ...` for the tests of
launching itself (exit codes, signals, the `lr-engine launch` wrapper, several nodes). All run
with OMP_NUM_THREADS=1 and a hard timeout. Nothing here patches collectives.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from .forkserver import ForkServer

__all__ = ["free_port", "run_cli", "run_ranks", "run_torchrun", "subprocess_env"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def subprocess_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_"))}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"})
    env.pop("LR_ALLOW_ACCELERATE_ENV", None)
    if extra:
        env.update(extra)
    return env


def run_torchrun(
    nproc: int,
    argv: Sequence[str],
    *,
    module: str | None = "lr_engine.cli",
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
    cwd: Path | None = None,
    extra_torchrun: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """torchrun N local processes of `python -m module argv...` (or a script when module is None)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *extra_torchrun]
    if module is not None:
        cmd += ["-m", module]
    cmd += list(argv)
    return subprocess.run(cmd, env=subprocess_env(env), capture_output=True, text=True, timeout=timeout, cwd=cwd)


def run_ranks(
    nproc: int,
    argv: Sequence[str],
    *,
    module: str | None = "lr_engine.cli",
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """N local worker processes of `python -m module argv...` (or a script when module is None),
    started as torchrun's `--standalone --nproc-per-node=N` starts them, without its agent."""
    port = str(free_port())
    envs = []
    for rank in range(nproc):
        ranks = {"RANK": rank, "LOCAL_RANK": rank, "GROUP_RANK": 0, "ROLE_RANK": rank, "WORLD_SIZE": nproc,
                 "LOCAL_WORLD_SIZE": nproc, "GROUP_WORLD_SIZE": 1, "ROLE_WORLD_SIZE": nproc, "ROLE_NAME": "default",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "TORCHELASTIC_RESTART_COUNT": 0,
                 "TORCHELASTIC_MAX_RESTARTS": 0, "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": "False"}
        envs.append(subprocess_env({**(env or {}), **{k: str(v) for k, v in ranks.items()}}))
    target, args = (module, list(argv)) if module is not None else (str(argv[0]), list(argv[1:]))  # a script's path
    cmd = [sys.executable, *(["-m"] if module is not None else []), target, *args]
    with tempfile.TemporaryDirectory(prefix="lr-ranks-") as workdir:
        pids = _FORK_SERVER.start(target, args, envs, cwd=cwd, workdir=Path(workdir))
        try:
            returncode = _wait_like_torchrun(pids, timeout)
        finally:
            _FORK_SERVER.finish()
        out, err = (Path(workdir) / "stdout").read_text(errors="replace"), (Path(workdir) / "stderr").read_text(errors="replace")
    if returncode is None:
        raise subprocess.TimeoutExpired(cmd, timeout, out, err)
    return subprocess.CompletedProcess(cmd, returncode, out, err)


def _wait_like_torchrun(pids: list[int], timeout: float) -> int | None:
    """0 when every worker exits 0; else the first failure's code (1 for a signal), after the
    others are stopped as torchrun stops them (SIGTERM, then SIGKILL 30 s later); None when
    `timeout` passed first (every worker is then killed)."""
    running, failed, deadline = set(pids), 0, time.monotonic() + timeout
    while running and not failed:
        ended = _FORK_SERVER.next_exit(max(0.0, deadline - time.monotonic()))
        if ended is None:
            break
        running.discard(ended[0])
        failed = ended[1] if ended[1] > 0 else (1 if ended[1] < 0 else 0)
    timed_out = bool(running) and not failed
    for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 60.0)):
        if not running:
            break
        for pid in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig) if sig == signal.SIGKILL else os.kill(pid, sig)
        stop_by = time.monotonic() + grace
        while running and (ended := _FORK_SERVER.next_exit(max(0.0, stop_by - time.monotonic()))) is not None:
            running.discard(ended[0])
    return None if timed_out else failed


def run_cli(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `python -m <module> args` for argv like ["lr_engine.cli", "train", "--steps=3"] (or
    `python script.py args` when argv[0] is a .py file), as a
    process of its own forked from one that has imported torch already (`forkserver`);
    LR_TEST_FORKSERVER=0 starts a plain interpreter instead."""
    if os.environ.get("LR_TEST_FORKSERVER", "1") == "0":
        cmd = [sys.executable, *argv] if argv[0].endswith(".py") else [sys.executable, "-m", *argv]
        return subprocess.run(cmd, env=subprocess_env(env), capture_output=True, text=True, timeout=timeout, cwd=cwd)
    with tempfile.TemporaryDirectory(prefix="lr-cli-") as workdir:
        return _FORK_SERVER.run(argv[0], argv[1:], env=subprocess_env(env), cwd=cwd, timeout=timeout, workdir=Path(workdir))


_FORK_SERVER = ForkServer()
atexit.register(_FORK_SERVER.close)


@pytest.fixture
def ranks():
    return run_ranks


@pytest.fixture
def cli():
    return run_cli
