"""The readers that parse torch's private formats for speed, and their fallbacks.

With `LR_CHECKPOINT_FAST_PATHS=0`, resume's load, convert and verify go through torch's public
DCP reader and give the same tensors. With the fast paths on, a record they do not recognise
(here: a tensor DCP stored with non-contiguous strides, which lr never writes) is read by the
fallback and the process says so once.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import lr_checkpoint as lc
from _support.procs import subprocess_env
from ckpt_toy import assert_matches, make_model, make_optimizer
from lr_config.layout import StepFiles

pytestmark = pytest.mark.multiprocess

OFF = {"LR_CHECKPOINT_FAST_PATHS": "0"}
NOTE = "holds a tensor record that lr's fast reader does not recognise"


def cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lr_checkpoint.cli", *argv], capture_output=True, text=True,
                          env=subprocess_env(env or {}), timeout=300)


def test_resume_convert_and_verify_give_the_same_tensors_with_the_fast_paths_off(ckpt_runs: Path, copy_step,  # type: ignore[no-untyped-def]
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    fast = copy_step("fsdp_dcp")
    slow = fast.parent.parent.parent / "fsdp_dcp_off" / "checkpoints" / fast.name
    shutil.copytree(fast, slow)
    on, off = cli("convert", str(fast)), cli("convert", str(slow), env=OFF)
    assert on.returncode == 0 and off.returncode == 0, on.stderr + off.stderr
    assert NOTE not in on.stderr + off.stderr  # what lr writes, the fast paths know
    assert StepFiles(slow).model.read_bytes() == StepFiles(fast).model.read_bytes()

    from lr_checkpoint._convert import _specs
    from lr_checkpoint._formats.dcp.metadata import read_whole_dcp_metadata
    from lr_checkpoint._formats.dcp.stream import _plan, _Whole

    monkeypatch.setenv("LR_CHECKPOINT_FAST_PATHS", "0")
    meta = read_whole_dcp_metadata(StepFiles(slow).model_dcp)
    assert all(isinstance(part, _Whole) for part in _plan(meta, _specs(meta, "fp32")))  # every tensor through DCP
    model = make_model(11)
    optimizer = make_optimizer(model)
    lc.load_model_and_optimizer(ckpt_runs / "fsdp_dcp" / "checkpoints" / "000003", model, optimizer)
    assert_matches(ckpt_runs / "ref_fsdp.safetensors", model, optimizer, "fsdp2-2 dcp -> single, fast paths off")
    verified = cli("verify", str(ckpt_runs / "fsdp_dcp" / "checkpoints" / "last"), env=OFF)
    assert verified.returncode == 0 and verified.stdout.startswith("OK "), verified.stdout + verified.stderr


def test_a_record_the_fast_reader_does_not_know_is_read_by_the_fallback_and_said_once(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    step = StepFiles(tmp_path / "000001")
    weights = {
        "a": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "b": torch.linspace(0, 1, 20).reshape(4, 5),
        "rows": torch.ones(6, 2),
    }
    stored = {"a": weights["a"].t().contiguous().t(), "b": weights["b"].t().contiguous().t(), "rows": weights["rows"]}
    assert not stored["a"].is_contiguous()  # DCP keeps the strides: a record the fast reader leaves to DCP
    dcp.save(stored, storage_writer=FileSystemWriter(str(step.model_dcp)), no_dist=True)
    done = cli("convert", str(step.root))
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(NOTE) == 1, done.stderr
    assert f"torch {torch.__version__.split('+')[0]}" in done.stderr and "LR_CHECKPOINT_FAST_PATHS=0" in done.stderr
    got = load_file(str(step.model))
    assert sorted(got) == sorted(weights) and all(torch.equal(got[k], v) for k, v in weights.items())
    # resume's direct reader (DCP planning, bytes into the destination) falls back the same way
    load = ("import sys, torch; from pathlib import Path; from lr_checkpoint._formats.dcp.metadata import read_whole_dcp_metadata; "
            "from lr_checkpoint._formats.dcp.read import load_dcp_batch; "
            f"got = load_dcp_batch(read_whole_dcp_metadata(Path({str(step.model_dcp)!r})), ['a', 'b', 'rows']); "
            "expected = {'a': torch.arange(12, dtype=torch.float32).reshape(3, 4), 'b': torch.linspace(0, 1, 20).reshape(4, 5), "
            "'rows': torch.ones(6, 2)}; sys.exit(0 if all(torch.equal(got[k], v) for k, v in expected.items()) else 5)")
    loaded = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert loaded.stderr.count(NOTE) == 1 and "pytorch_model_fsdp_0" in loaded.stderr, loaded.stderr
