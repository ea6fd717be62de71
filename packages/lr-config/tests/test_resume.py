"""build_resume_launch / resume_is_sample_exact on checkpoint folders made here."""

from __future__ import annotations

from pathlib import Path

import pytest

from lr_config import (
    ConfigError,
    LaunchSpec,
    Topology,
    TrainingStep,
    parse_train_config,
    save_json,
    save_training_step,
    to_dict,
)
from lr_config import build_resume_launch, resume_config, resume_is_sample_exact


def _checkpoint(tmp_path: Path, flags: list[str], step: int = 100) -> Path:
    step_dir = tmp_path / "run" / "checkpoints" / f"{step:06d}"
    cfg = parse_train_config([f"--output_dir={tmp_path / 'run'}", *flags])
    save_json(step_dir / "pretrained_model" / "train_config.json", to_dict(cfg))
    save_training_step(step_dir / "training_state" / "training_step.json", TrainingStep(step=step, optimizer_updates=step))
    return step_dir


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        (["--steps=100"], "--steps: the checkpoint is at step 100; pass --steps > 100 to continue"),
        (["--steps=50"], "--steps: the checkpoint is at step 100; pass --steps > 100 to continue"),
        (["--steps=102", "--accelerator.gradient_accumulation.steps=4", "--save_freq=4"],
         "--steps: the checkpoint is at step 100 and an optimizer update takes 4 loop steps "
         "(--accelerator.gradient_accumulation.steps=4); pass --steps >= 104 to continue"),
        (["--steps=500", "--accelerator.gradient_accumulation.steps=3", "--save_freq=3"],
         "--accelerator.gradient_accumulation.steps: the checkpoint is at step 100, which is not a multiple of 3, so the first "
         "update would apply a partial accumulation; use a value that divides 100: 1, 2, 4 or 5"),
    ],
)
def test_a_resume_that_cannot_continue_gets_no_command(tmp_path, overrides, problem):
    """The engine would refuse it at start-up (exit 2); the TUI's resume command is refused first."""
    step_dir = _checkpoint(tmp_path, ["--steps=100"])
    with pytest.raises(ConfigError) as err:
        build_resume_launch(LaunchSpec(), step_dir, overrides)
    assert err.value.problems == [problem]
    assert build_resume_launch(LaunchSpec(), step_dir, ["--steps=200"])[-1] == "--steps=200"


def test_torchrun_resume_passes_only_resume_config_path_and_overrides(tmp_path):
    step_dir = _checkpoint(tmp_path, ["--parallelism.dp_shard=2", "--steps=500", "--batch_size=8"])
    argv = build_resume_launch(LaunchSpec(nproc_per_node=4), step_dir, ["--parallelism.dp_shard=4", "--steps=800"])
    assert argv == [
        "torchrun",
        "--standalone",
        "--nproc-per-node=4",
        "-m",
        "lr_engine.cli",
        "train",
        "--resume=true",
        f"--config_path={step_dir / 'pretrained_model' / 'train_config.json'}",
        "--parallelism.dp_shard=4",
        "--steps=800",
    ]


def test_accelerate_resume_keeps_the_saved_mixed_precision(tmp_path):
    step_dir = _checkpoint(tmp_path, ["--accelerator.mixed_precision=bf16"])
    argv = build_resume_launch(LaunchSpec(launcher="accelerate", nproc_per_node=2), step_dir)
    assert argv[:5] == ["accelerate", "launch", "--multi_gpu", "--num_processes=2", "--mixed_precision=bf16"]
    assert argv[5:8] == ["-m", "lr_engine.cli", "train"]
    assert argv[8] == "--resume=true"


def test_saved_topology_that_does_not_fit_the_new_world_size_is_refused(tmp_path):
    step_dir = _checkpoint(tmp_path, ["--parallelism.dp_shard=4"])
    with pytest.raises(ConfigError) as err:
        build_resume_launch(LaunchSpec(nproc_per_node=2), step_dir)
    assert any(line.startswith("--parallelism.dp_replicate x --parallelism.dp_shard") for line in err.value.problems)
    # the override is what fixes it
    argv = build_resume_launch(LaunchSpec(nproc_per_node=2), step_dir, ["--parallelism.dp_shard=-1"])
    assert argv[-1] == "--parallelism.dp_shard=-1"


def test_missing_checkpoint_config_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match="--config_path: .*train_config.json does not exist"):
        build_resume_launch(LaunchSpec(), tmp_path / "checkpoints" / "000100")


def test_bad_override_is_reported_with_its_flag(tmp_path):
    step_dir = _checkpoint(tmp_path, [])
    with pytest.raises(ConfigError, match="--stepz: unknown flag"):
        build_resume_launch(LaunchSpec(), step_dir, ["--stepz=10"])


def test_resume_config_merges_overrides_over_the_saved_file(tmp_path):
    step_dir = _checkpoint(tmp_path, ["--batch_size=8", "--steps=500"])
    cfg = resume_config(step_dir, ["--steps=900"])
    assert (cfg.batch_size, cfg.steps, cfg.resume) == (8, 900, True)


@pytest.mark.parametrize(
    ("saved_batch", "saved_dp", "batch", "dp_replicate", "dp_shard", "exact"),
    [
        (8, 4, 8, 1, 4, True),  # same layout
        (8, 4, 8, 2, 2, True),  # FSDP2 -> HSDP, same dp world
        (8, 4, 16, 1, 2, True),  # half the ranks, twice the batch
        (8, 4, 8, 1, 2, False),  # half the ranks, same batch
    ],
)
def test_sample_exact_when_batch_times_dp_world_is_unchanged(saved_batch, saved_dp, batch, dp_replicate, dp_shard, exact):
    saved = TrainingStep(step=100, batch_size=saved_batch, dp_world_size=saved_dp, seed=1000)
    cfg = parse_train_config([f"--batch_size={batch}", "--seed=1000"])
    topo = Topology(world_size=dp_replicate * dp_shard, dp_replicate=dp_replicate, dp_shard=dp_shard)
    assert resume_is_sample_exact(saved, cfg, topo) is exact


def test_a_new_seed_is_never_sample_exact() -> None:
    """The order of every epoch follows the seed: the same batch with another seed replays other samples."""
    saved = TrainingStep(step=100, batch_size=8, dp_world_size=1, seed=1000)
    topo = Topology(world_size=1, dp_replicate=1, dp_shard=1)
    assert resume_is_sample_exact(saved, parse_train_config(["--batch_size=8", "--seed=1000"]), topo) is True
    assert resume_is_sample_exact(saved, parse_train_config(["--batch_size=8", "--seed=7"]), topo) is False
