"""Saves and loads across formats and layouts, bit for bit (real processes, gloo on CPU).

The torchrun worker already asserted, inside the ranks: FSDP2-2 -> FSDP2-2 for each
format (and one more identical training step), DDP-2 -> FSDP2-2, FSDP2-2 DCP -> DDP-2,
single -> FSDP2-2, RNG restore and the async save. Here: what it left on disk, the
FSDP2-2 -> single loads without a process group, and the 4-rank HSDP load.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import lr_checkpoint as lc
from ckpt_toy import assert_matches, make_model, make_optimizer

pytestmark = pytest.mark.multiprocess

FORMATS = ("safetensors", "dcp", "safetensors_dcp")
# format -> (model.safetensors, pytorch_model_fsdp_0/, optimizer_state.safetensors, optimizer_0/) of a sharded
# run: its optimizer is DCP shards in every format (gathered into one file, it would cost the main rank its memory)
EXPECTED_FILES = {
    "safetensors": (True, False, False, True),
    "dcp": (False, True, False, True),
    "safetensors_dcp": (True, True, False, True),
}


def step_dir(runs: Path, name: str) -> Path:
    return runs / name / "checkpoints" / "000003"


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_writes_its_layout(ckpt_runs: Path, fmt: str) -> None:
    checkpoints = ckpt_runs / f"fsdp_{fmt}" / "checkpoints"
    root = checkpoints / "000003"
    present = (
        (root / "pretrained_model" / "model.safetensors").is_file(),
        (root / "pretrained_model" / "pytorch_model_fsdp_0" / ".metadata").is_file(),
        (root / "training_state" / "optimizer_state.safetensors").is_file(),
        (root / "training_state" / "optimizer_0" / ".metadata").is_file(),
    )
    assert present == EXPECTED_FILES[fmt]
    for name in ("pretrained_model/config.json", "pretrained_model/train_config.json", "training_state/training_step.json",
                 "training_state/rng_state.safetensors", "training_state/scheduler_state.json", "training_state/optimizer_param_groups.json"):
        assert (root / name).is_file(), name
    assert not (root / "training_state" / "scaler_state.json").exists()
    assert os.readlink(checkpoints / "last") == "000003"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["000003", "last"]
    step = lc.read_training_step(root)
    assert (step.step, step.checkpoint_format, step.topology.layout) == (3, fmt, "fsdp2")


def test_non_sharded_runs_always_save_safetensors(ckpt_runs: Path) -> None:
    root = step_dir(ckpt_runs, "ddp")  # the DDP run asked for safetensors_dcp
    assert lc.read_training_step(root).checkpoint_format == "safetensors"
    assert (root / "pretrained_model" / "model.safetensors").is_file()
    assert not (root / "pretrained_model" / "pytorch_model_fsdp_0").exists()
    assert not (root / "training_state" / "optimizer_0").exists()


@pytest.mark.parametrize("fmt", FORMATS)
def test_fsdp2_checkpoint_loads_into_one_process_without_process_group(ckpt_runs: Path, fmt: str) -> None:
    model = make_model(11)
    optimizer = make_optimizer(model)
    lc.load_model_and_optimizer(step_dir(ckpt_runs, f"fsdp_{fmt}"), model, optimizer)
    assert_matches(ckpt_runs / "ref_fsdp.safetensors", model, optimizer, f"fsdp2-2 {fmt} -> single")


def test_single_save_round_trips_in_process(ckpt_runs: Path) -> None:
    model = make_model(12)
    optimizer = make_optimizer(model)
    lc.load_model_and_optimizer(ckpt_runs / "single" / "checkpoints", model, optimizer)
    assert_matches(ckpt_runs / "ref_single.safetensors", model, optimizer, "single -> single")
    assert isinstance(optimizer.param_groups[0]["betas"], tuple)


def test_hsdp_2x2_loads_fsdp2_checkpoints(hsdp_run) -> None:  # type: ignore[no-untyped-def]
    assert hsdp_run.returncode == 0 and "OK hsdp" in hsdp_run.stdout, hsdp_run.stdout[-3000:] + hsdp_run.stderr[-6000:]


def test_keep_two_prunes_older_steps(ckpt_runs: Path) -> None:
    checkpoints = ckpt_runs / "keep" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["000005", "000006", "last"]
    assert os.readlink(checkpoints / "last") == "000006"


def test_async_save_is_committed_by_wait(ckpt_runs: Path) -> None:
    checkpoints = ckpt_runs / "async" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["000002", "last"]
    assert lc.verify_checkpoint(checkpoints) == []


def test_every_path_form_resolves_to_the_step_folder(ckpt_runs: Path) -> None:
    root = step_dir(ckpt_runs, "fsdp_dcp").resolve()
    forms = [root, root / "pretrained_model", root / "pretrained_model" / "train_config.json",
             root.parent / "last", root.parent, root.parent.parent]
    assert [lc.resolve_step_dir(p) for p in forms] == [root] * len(forms)


def test_resume_phase_one_reads_step_scheduler_and_rng(ckpt_runs: Path) -> None:
    state = lc.read_resume_state(ckpt_runs / "fsdp_dcp" / "checkpoints" / "last")
    assert state.training_step.step == 3 and state.training_step.samples_seen == 24
    assert state.scheduler_state == {"last_epoch": 3, "base_lrs": [0.01, 0.01]}
    assert state.scaler_state is None
    root = step_dir(ckpt_runs, "fsdp_dcp")
    before = torch.get_rng_state()
    assert lc.restore_rng(root, 1) and not torch.equal(before, torch.get_rng_state())
    assert lc.restore_rng(root, 2) is False


def test_loading_into_a_different_model_names_the_mismatch(ckpt_runs: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(18, 5))
    with pytest.raises(lc.CheckpointError, match=r"model.safetensors: does not match this model \(missing 0.bias, 0.weight; not in this model: blocks.0.linear.bias"):
        lc.load_model_and_optimizer(step_dir(ckpt_runs, "fsdp_safetensors"), model)


def test_gather_model_state_dict_in_one_process_returns_fqn_keys() -> None:
    model = make_model(13)
    state = lc.gather_model_state_dict(model)
    assert set(state) == set(model.state_dict())
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
