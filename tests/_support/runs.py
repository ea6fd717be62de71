"""Shared fixtures: real tiny training runs, made once per session by the real CLIs.

- `tiny_run`: one process, `lr-engine train` with the tiny ACT of `TINY`, 4 steps saved at
  2 and 4 (`checkpoints/000002`, `000004`, `last -> 000004`), safetensors format.
- `dcp_run`: the same schedule on 2 processes (`run_ranks`), FSDP2 (`dp_shard=2`),
  `--checkpoint_format=dcp` (DCP shards for the model and the optimizer), with a wider
  model (`WIDE`: `dim_model=64`) so that mixing its files with `tiny_run`'s cannot load by
  chance.

Both run with a planted Hugging Face token in their environment (`PLANTED_TOKEN`), so the
security tests can check that nothing wrote it. Tests never touch these folders: they
copy them (`copy_run`) and damage the copy. `tree_digest` is how a test proves that a
refused command left every file of a folder byte-identical (and wrote nothing new).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from .procs import run_cli, run_ranks

__all__ = ["PLANTED_TOKEN", "SCHEDULE", "TINY", "WIDE", "TinyRun", "copy_run", "dcp_run", "tiny_run", "tree_digest"]

PLANTED_TOKEN = "hf_lrPlantedTokenNeverWritten0123456789"
TINY = ["--policy.dim_model=32", "--policy.dim_feedforward=64", "--policy.n_heads=2", "--batch_size=4", "--log_freq=1"]
"""The tiny ACT (about 51k parameters) every fault, security and bad-input run trains."""
SCHEDULE = ["--steps=4", "--save_freq=2"]
WIDE = [("--policy.dim_model=64" if flag.startswith("--policy.dim_model=") else flag) for flag in TINY]


@dataclass(frozen=True)
class TinyRun:
    """A finished run folder and the output of the command that made it."""

    path: Path
    proc: subprocess.CompletedProcess[str]

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"


def _finished(path: Path, proc: subprocess.CompletedProcess[str]) -> TinyRun:
    assert proc.returncode == 0, f"{proc.args}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert os.readlink(path / "checkpoints" / "last") == "000004"
    return TinyRun(path=path, proc=proc)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory, demo_dataset: Path) -> TinyRun:
    out = tmp_path_factory.mktemp("tiny_run") / "run"
    proc = run_cli(
        ["lr_engine.cli", "train", f"--output_dir={out}", f"--dataset.root={demo_dataset}", *TINY, *SCHEDULE],
        env={"HF_TOKEN": PLANTED_TOKEN},
    )
    return _finished(out, proc)


@pytest.fixture(scope="session")
def dcp_run(tmp_path_factory: pytest.TempPathFactory, demo_dataset: Path) -> TinyRun:
    out = tmp_path_factory.mktemp("dcp_run") / "run"
    proc = run_ranks(
        2,
        ["train", f"--output_dir={out}", f"--dataset.root={demo_dataset}", *WIDE, *SCHEDULE,
         "--parallelism.dp_shard=2", "--checkpoint_format=dcp"],
        env={"HF_TOKEN": PLANTED_TOKEN},
    )
    return _finished(out, proc)


def copy_run(run: TinyRun | Path, dest: Path) -> Path:
    """A private copy of a run folder (the `last` link stays a relative link)."""
    shutil.copytree(run.path if isinstance(run, TinyRun) else run, dest, symlinks=True)
    return dest


def tree_digest(root: Path) -> dict[str, str]:
    """Every entry under `root`: sha256 of files, target of links, 'dir' for folders."""
    digest: dict[str, str] = {}
    for path in sorted(Path(root).rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            digest[rel] = "link -> " + os.readlink(path)
        elif path.is_dir():
            digest[rel] = "dir"
        else:
            digest[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digest
