"""The `lr-engine train` CLI end to end, single process: outputs, dry run, bad input."""

import hashlib
import json
import os
from pathlib import Path

import pytest
from lr_config import TRAIN_CONFIG_VERSION
from safetensors import safe_open

from _support.procs import run_cli

TINY = ["--policy.dim_model=32", "--policy.dim_feedforward=64", "--policy.n_heads=2", "--batch_size=16"]


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def tree_hash(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def test_tiny_act_run_writes_the_documented_files_and_learns(tmp_path, demo_dataset):
    out = tmp_path / "run"
    umask = os.umask(0o022)  # the run inherits it
    try:
        proc = run_cli(["lr_engine.cli", "train", f"--output_dir={out}", f"--dataset.root={demo_dataset}", *TINY,
                        "--steps=30", "--log_freq=5", "--save_freq=15", "--optimizer.lr=0.003"])
    finally:
        os.umask(umask)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # readable by a team: what the umask gives, never a private 0600/0700 from mkstemp/mkdtemp
    for path in (out, out / "pretrained_model", out / "checkpoints" / "000030", out / "checkpoints" / "000030" / "training_state"):
        assert path.stat().st_mode & 0o777 == 0o755, path
    for path in (out / "train_config.json", out / "pretrained_model" / "train_config.json", out / "pretrained_model" / "model.safetensors",
                 out / "checkpoints" / "000030" / "training_state" / "training_step.json", out / "run.json"):
        assert path.stat().st_mode & 0o777 == 0o644, path
    assert "batch_size 16 x dp_world_size 1 x grad_accum 1 = effective batch 16" in proc.stdout
    assert f"checkpoints in {out / 'checkpoints'}" in proc.stdout and "metrics.jsonl" in proc.stdout
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [5, 10, 15, 20, 25, 30]
    assert records[-1]["loss"] < records[0]["loss"]
    for key in ("epoch", "samples", "loss", "lr", "grad_norm", "update_s", "dataloading_s", "samples_per_s", "mem_gb"):
        assert key in records[0]
    assert {"l1_loss", "kld_loss"} <= set(records[0]["info"])
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "finished" and status["step"] == 30 and status["steps"] == 30
    config = json.loads((out / "train_config.json").read_text())
    assert config["version"] == TRAIN_CONFIG_VERSION and config["steps"] == 30 and config["dataset"]["root"] == str(demo_dataset)
    final = out / "pretrained_model"
    for name in ("config.json", "model.safetensors", "train_config.json", "policy_preprocessor.json", "policy_postprocessor.json"):
        assert (final / name).exists(), name
    with safe_open(str(final / "model.safetensors"), framework="pt") as f:
        assert len(list(f.keys())) > 10
    assert (out / "checkpoints" / "last").resolve() == (out / "checkpoints" / "000030").resolve()
    assert (out / "checkpoints" / "000015" / "training_state" / "training_step.json").exists()


def test_accumulation_saves_at_updates_and_the_final_checkpoint_is_the_last_update(tmp_path, demo_dataset):
    """K=2, 7 steps: updates at 2, 4, 6; --save_freq=4 saves 4, and the last update (6) is the
    final checkpoint (the run once ended without one when --steps was not a multiple of K)."""
    out = tmp_path / "run"
    proc = run_cli(["lr_engine.cli", "train", f"--output_dir={out}", f"--dataset.root={demo_dataset}", *TINY,
                    "--steps=7", "--save_freq=4", "--accelerator.gradient_accumulation.steps=2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "the last partial accumulation is not applied, and the final checkpoint is step 6" in proc.stdout
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["000004", "000006", "last"]
    assert (out / "checkpoints" / "last").resolve() == (out / "checkpoints" / "000006").resolve()
    step = json.loads((out / "checkpoints" / "000006" / "training_state" / "training_step.json").read_text())
    assert step["step"] == 6 and step["optimizer_updates"] == 3


def test_fine_tuning_applies_the_policy_flags_over_the_saved_config_and_refuses_another_architecture(tmp_path, demo_dataset):
    """`--policy.path` + `--policy.n_action_steps=3`: trained and recorded with 3 (the flag was once
    dropped silently); an architecture flag that does not fit the saved weights exits 2 naming them."""
    base = tmp_path / "base"
    proc = run_cli(["lr_engine.cli", "train", f"--output_dir={base}", f"--dataset.root={demo_dataset}", *TINY, "--steps=2",
                    "--save_checkpoint=false"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    tuned = tmp_path / "tuned"
    proc = run_cli(["lr_engine.cli", "train", f"--output_dir={tuned}", f"--dataset.root={demo_dataset}", "--steps=2", "--batch_size=8",
                    f"--policy.path={base / 'pretrained_model'}", "--policy.n_action_steps=3", "--save_checkpoint=false"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    for config in (tuned / "train_config.json", tuned / "pretrained_model" / "train_config.json"):
        policy = json.loads(config.read_text())["policy"]
        assert (policy["n_action_steps"], policy["dim_model"], policy["n_heads"]) == (3, 32, 2), config
    assert json.loads((tuned / "pretrained_model" / "config.json").read_text())["n_action_steps"] == 3
    wrong = tmp_path / "wrong"
    proc = run_cli(["lr_engine.cli", "train", f"--output_dir={wrong}", f"--dataset.root={demo_dataset}", "--steps=2",
                    f"--policy.path={base / 'pretrained_model'}", "--policy.dim_feedforward=128"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "does not fit the policy these settings build" in proc.stderr and "architecture settings" in proc.stderr
    assert not (wrong / "checkpoints").exists()


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, demo_dataset):
    out = tmp_path / "never"
    proc = run_cli(["lr_engine.cli", "train", "--dry_run=true", "--world_size=4", "--parallelism.dp_shard=-1",
                    f"--output_dir={out}", f"--dataset.root={demo_dataset}", *TINY])
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "batch_size 16 x dp_world_size 4 x grad_accum 1 = effective batch 64" in text
    assert "FSDP2 dp_replicate=1 dp_shard=4 world=4" in text
    assert "parameters (" in text and "trainable)" in text
    assert "model.encoder.layers.0  ACTEncoderLayer" in text and "model.decoder.layers.0  ACTDecoderLayer" in text
    assert "per-rank memory estimate" in text
    assert not out.exists()


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--stesp=3"], "did you mean '--steps'"),
        (["--batch_size=1.5"], "--batch_size: expected int"),
        (["--policy.type=actt"], "did you mean 'act'"),
        (["--parallelism.dp_shard=2"], "1 x 2 = 2, but 1 process will run"),
        (["--policy.n_action_steps=50"], "--policy.n_action_steps: must be <="),
        (["--policy.device=gpu"], "--policy.device: unknown device kind 'gpu'"),  # once a RuntimeError traceback, exit 1
        pytest.param(["--policy.device=cuda"], "--policy.device: cuda is not available on this machine (it has: cpu",
                     marks=pytest.mark.skipif(_has_cuda(), reason="this machine has CUDA")),
    ],
)
def test_bad_flags_exit_2_with_nothing_written(tmp_path, demo_dataset, flags, message):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    before = tree_hash(out)
    proc = run_cli(["lr_engine.cli", "train", f"--output_dir={out}", f"--dataset.root={demo_dataset}", *flags])
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert tree_hash(out) == before


def test_an_existing_run_folder_is_not_reused_without_resume(tmp_path, demo_dataset):
    out = tmp_path / "run"
    out.mkdir()
    (out / "train_config.json").write_text("{}")
    before = tree_hash(out)
    proc = run_cli(["lr_engine.cli", "train", f"--output_dir={out}", f"--dataset.root={demo_dataset}", *TINY, "--steps=2"])
    assert proc.returncode == 2 and "--resume=true" in proc.stderr
    assert tree_hash(out) == before


def test_help_lists_every_flag():
    proc = run_cli(["lr_engine.cli", "train", "--help"])
    assert proc.returncode == 0
    for flag in ("--accelerator.fsdp.min_num_params", "--parallelism.dp_shard", "--peft.r", "--policy.chunk_size"):
        assert flag in proc.stdout


def test_trackio_logs_offline_without_printing_a_token_url(tmp_path, demo_dataset):
    out, store = tmp_path / "run", tmp_path / "trackio"
    proc = run_cli(["lr_engine.cli", "train", f"--output_dir={out}", f"--dataset.root={demo_dataset}", *TINY, "--steps=4",
                    "--log_freq=2", "--save_checkpoint=false", "--trackio.enable=true", "--trackio.project=lrtest"],
                   env={"TRACKIO_DIR": str(store)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    databases = list(store.rglob("*.db"))
    assert databases, list(store.rglob("*"))
    import sqlite3

    with sqlite3.connect(databases[0]) as db:
        tables = [r[0] for r in db.execute("select name from sqlite_master where type='table'")]
        assert tables
        counts = [db.execute(f'select count(*) from "{t}"').fetchone()[0] for t in tables]
    assert sum(counts) >= 2
    assert "write_token" not in proc.stdout + proc.stderr
    # nothing was saved, and the closing line says so instead of naming a folder that is not there
    assert not (out / "checkpoints").exists()
    assert "done: no checkpoints (--save_checkpoint=false), metrics in" in proc.stdout


def test_bf16_on_a_gpu_without_it_names_the_flag() -> None:
    """The rule the engine applies with torch's answer for the device (a pre-Ampere GPU has no bf16)."""
    import torch

    from lr_engine._parallel.dist import precision_problem

    problem = precision_problem("bf16", torch.device("cuda", 0), bf16_supported=False)
    assert problem == ("--accelerator.mixed_precision=bf16: cuda:0 has no bf16 support; use --accelerator.mixed_precision=fp16 "
                       "(with its loss scaler) or no")
    assert precision_problem("bf16", torch.device("cuda", 0), bf16_supported=True) == ""
    assert precision_problem("bf16", torch.device("cpu"), bf16_supported=False) == ""  # CPU autocast runs bf16
    assert precision_problem("fp16", torch.device("cuda", 0), bf16_supported=False) == ""


def test_without_policy_flags_the_plan_names_the_demo_preset(demo_dataset):
    proc = run_cli(["lr_engine.cli", "train", "--dry_run=true", f"--dataset.root={demo_dataset}"])
    assert proc.returncode == 0, proc.stderr
    assert ("policy: act, demo preset (chunk_size=10, n_action_steps=10, dim_model=128, n_heads=4, dim_feedforward=512, "
            "n_encoder_layers=2, n_vae_encoder_layers=2, backbone from scratch); --policy.type=act alone gives LeRobot's defaults") in proc.stdout
    lerobot = run_cli(["lr_engine.cli", "train", "--dry_run=true", f"--dataset.root={demo_dataset}", "--policy.type=act"])
    assert lerobot.returncode == 0, lerobot.stderr
    assert "demo preset" not in lerobot.stdout and "policy act: " in lerobot.stdout
    # LeRobot's ACT under lr's optimizer defaults: the plan says how they differ from lerobot-train's preset
    assert ("optimizer: adamw lr 0.001, weight decay 0.0001, cosine after 20 warmup steps; lerobot-train's preset for act is adamw "
            "lr 1e-05, weight decay 0.0001, constant: --optimizer.lr=1e-05 --scheduler.type=constant --scheduler.warmup_steps=0 "
            "trains as it does") in lerobot.stdout
    assert "optimizer:" not in proc.stdout  # the demo preset is lr's own
