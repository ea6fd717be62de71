"""Shared fixtures: real multi-process runs (torchrun on gloo, CPU).

`run_torchrun(nproc, argv, ...)` starts `python -m torch.distributed.run --standalone
--nproc-per-node=N ...` with OMP_NUM_THREADS=1 and a hard timeout, and returns the
CompletedProcess. `run_ranks(nproc, argv, ...)` starts the same N worker processes without
torchrun's agent: each gets the environment torchrun gives its workers (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), their output is merged as under
torchrun, and when one fails the others are sent SIGTERM, then SIGKILL, as torchrun does.
The agent costs a full `import torch` (4 to 6 s of one core here) before any worker starts;
tests of the training itself use `run_ranks`, tests of launching (exit codes, signals, the
`lr-engine launch` wrapper, several nodes) keep torchrun. `run_cli(argv)` runs one of our
console entry points in a subprocess. Nothing here patches collectives: every multi-process
test uses real processes.
"""

from __future__ import annotations

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
    cmd = [sys.executable, *(["-m", module] if module is not None else []), *argv]
    port = str(free_port())
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        procs = []
        for rank in range(nproc):
            ranks = {"RANK": rank, "LOCAL_RANK": rank, "GROUP_RANK": 0, "ROLE_RANK": rank, "WORLD_SIZE": nproc,
                     "LOCAL_WORLD_SIZE": nproc, "GROUP_WORLD_SIZE": 1, "ROLE_WORLD_SIZE": nproc, "ROLE_NAME": "default",
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "TORCHELASTIC_RESTART_COUNT": 0,
                     "TORCHELASTIC_MAX_RESTARTS": 0, "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": "False"}
            worker_env = subprocess_env({**(env or {}), **{k: str(v) for k, v in ranks.items()}})
            procs.append(subprocess.Popen(cmd, env=worker_env, stdout=out, stderr=err, text=True, cwd=cwd))
        returncode = _wait_like_torchrun(procs, timeout, cmd)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(cmd, returncode, out.read(), err.read())


def _wait_like_torchrun(procs: list[subprocess.Popen[str]], timeout: float, cmd: list[str]) -> int:
    """0 when every worker exits 0; else the first failure's code, after the others are stopped
    (SIGTERM, then SIGKILL 30 s later: torchrun's shutdown)."""
    deadline = time.monotonic() + timeout
    failed = 0
    while any(p.poll() is None for p in procs):
        failed = next((p.returncode for p in procs if p.returncode not in (None, 0)), 0)
        if failed or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    failed = failed or next((p.returncode for p in procs if p.returncode not in (None, 0)), 0)
    if any(p.poll() is None for p in procs):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        stop_by = time.monotonic() + 30
        while any(p.poll() is None for p in procs) and time.monotonic() < stop_by:
            time.sleep(0.05)
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        if not failed:
            raise subprocess.TimeoutExpired(cmd, timeout)
    return failed if failed >= 0 else 1


def run_cli(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `python -m <module> args` for argv like ["lr_engine.cli", "train", "--steps=3"]."""
    cmd = [sys.executable, "-m", *argv]
    return subprocess.run(cmd, env=subprocess_env(env), capture_output=True, text=True, timeout=timeout, cwd=cwd)


@pytest.fixture
def torchrun():
    return run_torchrun


@pytest.fixture
def ranks():
    return run_ranks


@pytest.fixture
def cli():
    return run_cli
