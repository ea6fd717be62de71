"""Session fixtures of the lr-checkpoint tests: real saves, made once, shared read-only.

`ckpt_runs` makes, in order:
- `single/`: a single-process save (no process group) from this pytest process;
- one 2-rank torchrun of `ckpt_worker.py fsdp2` (gloo, CPU): every format from FSDP2,
  DDP, keep-K, RNG, async; it ends paused inside a DCP save, where we SIGKILL rank 0.
Tests that modify a checkpoint copy it first (`copy_step`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from _support.procs import run_ranks, subprocess_env  # noqa: E402

WORKER = HERE / "ckpt_worker.py"


def _single_save(work: Path) -> None:
    import lr_checkpoint as lc
    from ckpt_toy import make_model, make_optimizer, request, snapshot, train

    model = make_model(10)
    optimizer = make_optimizer(model)
    train(model, optimizer, 2, rank=0)
    snapshot(work / "ref_single.safetensors", model, optimizer, rank=0)
    lc.save_checkpoint(work / "single" / "checkpoints", 2, request(model, optimizer, 2, "dcp"))


def _kill_when_paused(proc: subprocess.Popen[str], marker: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            return
        time.sleep(0.1)
    os.kill(int(marker.read_text()), signal.SIGKILL)


def _fsdp2_launch(work: Path) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(WORKER), "fsdp2", str(work)]
    env = subprocess_env({"CRASH_AT": "between_shards"})
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        _kill_when_paused(proc, work / "crash" / "checkpoints" / ".paused-between_shards", timeout=300)
        output, _ = proc.communicate(timeout=120)
    return output


@pytest.fixture(scope="session")
def ckpt_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("ckpt")
    _single_save(work)
    output = _fsdp2_launch(work)
    assert "OK fsdp2" in output, output[-6000:]
    assert (work / "crash" / "checkpoints" / ".paused-between_shards").exists(), output[-6000:]
    return work


@pytest.fixture(scope="session")
def hsdp_run(ckpt_runs: Path) -> subprocess.CompletedProcess[str]:
    return run_ranks(4, [str(WORKER), "hsdp", str(ckpt_runs)], module=None, timeout=400)


@pytest.fixture
def copy_step(ckpt_runs: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    """`copy_step("fsdp_dcp")` -> a private copy of that run's last step folder."""

    def copy(name: str) -> Path:
        source = (ckpt_runs / name / "checkpoints" / "last").resolve()
        target = tmp_path / name / "checkpoints" / source.name
        shutil.copytree(source, target)
        (target.parent / "last").symlink_to(source.name)
        return target

    return copy
