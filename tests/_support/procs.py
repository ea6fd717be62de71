"""Shared fixtures: real multi-process runs (torchrun on gloo, CPU).

`run_torchrun(nproc, argv, ...)` starts `python -m torch.distributed.run --standalone
--nproc-per-node=N ...` with OMP_NUM_THREADS=1 and a hard timeout, and returns the
CompletedProcess. `run_cli(argv)` runs one of our console entry points in a subprocess.
Nothing here patches collectives: every multi-process test uses real processes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

__all__ = ["free_port", "run_cli", "run_torchrun", "subprocess_env"]


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
def cli():
    return run_cli
