"""A SIGKILL at any point of a save leaves the previous checkpoint whole and `last` on it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import lr_checkpoint as lc
from ckpt_toy import assert_matches, make_model, make_optimizer, request

pytestmark = pytest.mark.multiprocess

HERE = Path(__file__).parent
POINTS = ("before_shards", "between_shards", "before_rename", "before_last")


@pytest.fixture(scope="module")
def killed_single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from _support.procs import subprocess_env

    work = tmp_path_factory.mktemp("crash_single")
    done = subprocess.run([sys.executable, str(HERE / "ckpt_crash_single.py"), str(work)], env=subprocess_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert done.stdout.split() == [w for p in POINTS for w in ("KILLED", p)]
    return work


def assert_previous_intact(checkpoints: Path, reference: Path) -> None:
    assert os.readlink(checkpoints / "last") == "000001"
    assert lc.verify_checkpoint(checkpoints) == []
    model = make_model(20)
    optimizer = make_optimizer(model)
    lc.load_model_and_optimizer(checkpoints / "last", model, optimizer)
    assert_matches(reference, model, optimizer, f"after a kill in {checkpoints}")


@pytest.mark.parametrize("point", POINTS)
def test_kill_in_single_process_save(killed_single: Path, point: str) -> None:
    checkpoints = killed_single / point / "checkpoints"
    assert_previous_intact(checkpoints, killed_single / "ref.safetensors")
    leftovers = [p.name for p in checkpoints.iterdir() if p.name.startswith(".tmp-")]
    if point == "before_last":  # renamed and whole, only `last` had not moved yet
        assert leftovers == [] and lc.verify_checkpoint(checkpoints / "000002") == []
    else:
        assert not (checkpoints / "000002").exists() and len(leftovers) == 1
        with pytest.raises(lc.CheckpointError, match="unfinished save"):
            lc.resolve_step_dir(checkpoints / leftovers[0])


def test_kill_between_dcp_shards_of_fsdp2_save(ckpt_runs: Path) -> None:
    checkpoints = ckpt_runs / "crash" / "checkpoints"
    leftovers = [p for p in checkpoints.iterdir() if p.name.startswith(".tmp-000002-")]
    assert len(leftovers) == 1 and (leftovers[0] / "pretrained_model" / "pytorch_model_fsdp_0" / ".metadata").exists()
    assert not (checkpoints / "000002").exists()
    assert_previous_intact(checkpoints, ckpt_runs / "ref_crash.safetensors")


def test_next_save_clears_leftovers(killed_single: Path, tmp_path: Path) -> None:
    # a copy of its own: the module's killed folders are read by the tests above, in any order
    checkpoints = Path(shutil.copytree(killed_single / "between_shards" / "checkpoints", tmp_path / "checkpoints", symlinks=True))
    model = make_model(21)
    optimizer = make_optimizer(model)
    lc.save_checkpoint(checkpoints, 3, request(model, optimizer, 3))
    assert sorted(p.name for p in checkpoints.iterdir() if not p.name.startswith(".paused")) == ["000001", "000003", "last"]
    assert os.readlink(checkpoints / "last") == "000003"
