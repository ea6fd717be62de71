"""Every layout through the real CLI on several processes (gloo, CPU): parity, accumulation,
precision, reduced metrics, start-up errors and failure propagation. The training runs start
their ranks with `run_ranks` (torchrun's worker environment without its agent); the start-up
errors, failure propagation and accelerate tests go through torchrun itself.

The straight runs are module-scoped fixtures shared with tests/test_resume.py's
expectations; each launch costs seconds of start-up, so scenarios are grouped.

Parity is checked on the loss, the logged pre-clip `grad_norm` of every step and the final
weights, with AdamW (the default) and with plain SGD (`SGD`: no momentum, no weight decay, no
clipping). AdamW's update barely moves when every gradient is multiplied by a constant, so
only the SGD runs and the grad norms catch a gradient-scale bug: a missing division by the
accumulation steps or by the world size, or ranks summing instead of averaging.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from _support.metrics import grad_norms, losses, records
from _support.procs import run_cli, run_ranks, run_torchrun

pytestmark = pytest.mark.multiprocess

# Deterministic (no dropout, no CVAE sampling) so layouts can be compared step by step.
TINY = [
    "--policy.dim_model=32",
    "--policy.dim_feedforward=64",
    "--policy.n_heads=2",
    "--policy.n_encoder_layers=2",
    "--policy.chunk_size=5",
    "--policy.n_action_steps=5",
    "--policy.use_vae=false",
    "--policy.dropout=0",
    "--scheduler.type=constant",
    "--scheduler.warmup_steps=0",
    "--log_freq=1",
]
GLOBAL_BATCH = 8
SGD = [
    "--optimizer.type=sgd",
    "--optimizer.betas=[0, 0.999]",
    "--optimizer.weight_decay=0",
    "--optimizer.grad_clip_norm=0",
    "--optimizer.lr=0.05",
]
"""Plain SGD: the update is lr x gradient, so any scale error in the gradients moves the weights."""


DEAD_QK = "model.decoder.layers.0.self_attn.in_proj_"
"""ACT's first decoder layer attends over its input, which is all zeros (LeRobot's ACT): every
value vector is the same, so without dropout the query and key projections (the first 2/3 of
in_proj_weight and in_proj_bias) have a true gradient of exactly zero. Rounding leaves noise
there that Adam scales up to full-size updates, different on every layout; they cannot change
an output."""


def live(key: str, tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` without the rows whose true gradient is zero (`DEAD_QK`)."""
    return tensor[2 * tensor.shape[0] // 3 :] if key.startswith(DEAD_QK) else tensor


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return {k: live(k, v) for k, v in load_file(str(run_dir / "pretrained_model" / "model.safetensors")).items()}


def train(tmp: Path, name: str, nproc: int, *flags: str, env: dict[str, str] | None = None) -> Path:
    out = tmp / name
    argv = ["train", f"--output_dir={out}", f"--dataset.root={os.environ['LR_TEST_DATASET']}", *TINY, *flags]
    if nproc == 1:
        proc = run_cli(["lr_engine.cli", *argv], env=env)
    else:
        proc = run_ranks(nproc, argv, env=env)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, demo_dataset: Path) -> dict[str, Path]:
    """Straight 10-step runs with the same global batch on four layouts."""
    os.environ["LR_TEST_DATASET"] = str(demo_dataset)
    tmp = tmp_path_factory.mktemp("layouts")
    common = ["--steps=10", "--save_checkpoint=false"]
    return {
        "single": train(tmp, "single", 1, *common, f"--batch_size={GLOBAL_BATCH}"),
        "ddp": train(tmp, "ddp", 2, *common, f"--batch_size={GLOBAL_BATCH // 2}", env={"LR_LOG_RANK_METRICS": "1"}),
        "fsdp": train(tmp, "fsdp", 2, *common, f"--batch_size={GLOBAL_BATCH // 2}", "--parallelism.dp_shard=2"),
        "hsdp": train(tmp, "hsdp", 4, *common, f"--batch_size={GLOBAL_BATCH // 4}", "--parallelism.dp_replicate=2", "--parallelism.dp_shard=2"),
    }


def assert_same_steps(runs: dict[str, Path], steps: int) -> None:
    """Every layout logs the single process's loss and pre-clip grad_norm at every step."""
    ref_loss, ref_norm = losses(runs["single"]), grad_norms(runs["single"])
    assert len(ref_loss) == steps and all(n > 0 for n in ref_norm)
    for layout in ("ddp", "fsdp", "hsdp"):
        assert losses(runs[layout]) == pytest.approx(ref_loss, rel=1e-5), layout
        assert grad_norms(runs[layout]) == pytest.approx(ref_norm, rel=1e-5), layout
    assert ref_loss[-1] < ref_loss[0]


def assert_same_weights(runs: dict[str, Path]) -> None:
    reference = weights(runs["single"])
    for layout in ("ddp", "fsdp", "hsdp"):
        got = weights(runs[layout])
        assert got.keys() == reference.keys()
        for key in reference:
            torch.testing.assert_close(got[key], reference[key], rtol=1e-4, atol=1e-5, msg=f"{layout} {key}")


def test_loss_and_grad_norm_parity_across_layouts(runs: dict[str, Path]) -> None:
    assert_same_steps(runs, 10)


def test_final_weights_agree_across_layouts(runs: dict[str, Path]) -> None:
    assert_same_weights(runs)


@pytest.fixture(scope="module")
def sgd_runs(tmp_path_factory: pytest.TempPathFactory, demo_dataset: Path) -> dict[str, Path]:
    """Plain-SGD runs of the same global batch on four layouts. The FSDP2 run leaves the action
    head unsharded (`ignored_modules`), so lr's own all-reduce of its gradients is checked too."""
    os.environ["LR_TEST_DATASET"] = str(demo_dataset)
    tmp = tmp_path_factory.mktemp("layouts_sgd")
    common = ["--steps=6", "--save_checkpoint=false", *SGD]
    return {
        "single": train(tmp, "single", 1, *common, f"--batch_size={GLOBAL_BATCH}"),
        "ddp": train(tmp, "ddp", 2, *common, f"--batch_size={GLOBAL_BATCH // 2}"),
        "fsdp": train(tmp, "fsdp", 2, *common, f"--batch_size={GLOBAL_BATCH // 2}", "--parallelism.dp_shard=2",
                      "--accelerator.fsdp.ignored_modules=model.action_head"),
        "hsdp": train(tmp, "hsdp", 4, *common, f"--batch_size={GLOBAL_BATCH // 4}", "--parallelism.dp_replicate=2", "--parallelism.dp_shard=2"),
    }


def test_sgd_loss_grad_norm_and_weights_agree_across_layouts(sgd_runs: dict[str, Path]) -> None:
    assert_same_steps(sgd_runs, 6)
    assert_same_weights(sgd_runs)


def test_logged_loss_is_the_mean_of_the_ranks(runs: dict[str, Path]) -> None:
    logged = losses(runs["ddp"])
    per_rank = [
        [json.loads(line)["loss"] for line in (runs["ddp"] / f"metrics_rank{r}.jsonl").read_text().splitlines()]
        for r in range(2)
    ]
    assert per_rank[0] != per_rank[1]
    for step, value in enumerate(logged):
        assert value == pytest.approx((per_rank[0][step] + per_rank[1][step]) / 2, rel=1e-6)


def test_metrics_records_count_the_whole_cluster(runs: dict[str, Path]) -> None:
    assert [r["samples"] for r in records(runs["hsdp"])] == [GLOBAL_BATCH * (i + 1) for i in range(10)]
    run = json.loads((runs["hsdp"] / "run.json").read_text())
    assert run["status"] == "finished" and run["world_size"] == 4 and run["step"] == 10
    config = json.loads((runs["hsdp"] / "train_config.json").read_text())
    assert config["parallelism"]["dp_replicate"] == 2 and config["parallelism"]["dp_shard"] == 2


@pytest.fixture(scope="module")
def video_runs(tmp_path_factory: pytest.TempPathFactory, video_dataset: Path) -> dict[str, Path]:
    """Two AV1 cameras decoded in DataLoader workers, with image augmentation, on three layouts."""
    tmp = tmp_path_factory.mktemp("layouts_video")
    common = [f"--dataset.root={video_dataset}", "--steps=4", "--save_checkpoint=false", "--num_workers=1",
              "--dataset.image_transforms.enable=true"]

    def run(name: str, nproc: int, *extra: str) -> Path:
        out = tmp / name
        argv = ["train", f"--output_dir={out}", *TINY, *common, *extra]
        proc = run_cli(["lr_engine.cli", *argv]) if nproc == 1 else run_ranks(nproc, argv)
        assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return out

    return {
        "single": run("single", 1, f"--batch_size={GLOBAL_BATCH}"),
        "ddp": run("ddp", 2, f"--batch_size={GLOBAL_BATCH // 2}"),
        "fsdp": run("fsdp", 2, f"--batch_size={GLOBAL_BATCH // 2}", "--parallelism.dp_shard=2"),
    }


def test_video_datasets_train_alike_on_every_layout(video_runs: dict[str, Path]) -> None:
    """Decoded frames and their augmentation depend on the sample, never on the rank or worker: the
    layouts agree step for step as on tabular data."""
    ref_loss, ref_norm = losses(video_runs["single"]), grad_norms(video_runs["single"])
    assert len(ref_loss) == 4
    for layout in ("ddp", "fsdp"):
        assert losses(video_runs[layout]) == pytest.approx(ref_loss, rel=1e-5), layout
        assert grad_norms(video_runs[layout]) == pytest.approx(grad_norms(video_runs["single"]), rel=1e-5), layout
    config = json.loads((video_runs["fsdp"] / "train_config.json").read_text())
    assert config["dataset"]["video_backend"] == "pyav" and config["dataset"]["image_transforms"]["enable"] is True


@pytest.mark.parametrize(("sharded", "optimizer"), [(False, "adamw"), (False, "sgd"), (True, "sgd")],
                         ids=["single-adamw", "single-sgd", "fsdp2-sgd"])
def test_gradient_accumulation_equals_a_larger_batch(tmp_path: Path, demo_dataset: Path, sharded: bool, optimizer: str) -> None:
    os.environ["LR_TEST_DATASET"] = str(demo_dataset)
    nproc = 2 if sharded else 1
    extra = ["--parallelism.dp_shard=2"] if sharded else []
    base = ["--save_checkpoint=false", *extra, *(SGD if optimizer == "sgd" else [])]
    big = train(tmp_path, "k1", nproc, *base, "--batch_size=4", "--steps=6")
    # 13 loop steps: the last, partial accumulation is not applied (so the weights match), and
    # on 2 ranks its stop-flag exchange is still in flight when the loop ends (drained there)
    accumulated = train(tmp_path, "k2", nproc, *base, "--batch_size=2", "--accelerator.gradient_accumulation.steps=2", "--steps=13")
    # the update of loop steps 2i-1 and 2i is the larger batch's update i: the same pre-clip norm
    updates = [r["grad_norm"] for r in records(accumulated) if r["step"] % 2 == 0]
    assert updates == pytest.approx(grad_norms(big), rel=1e-5)
    a, b = weights(big), weights(accumulated)
    # Adam moves an element whose gradient is at rounding level (|g| << eps) by up to lr x |g| / eps
    # a step, in whichever direction rounding gives it; SGD has no such amplifier (and is the run
    # that would show a scale error: Adam is blind to one)
    atol = 5e-5 if optimizer == "adamw" else 1e-6
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=atol, msg=lambda m, key=key: f"{key}: {m}")


def test_bf16_and_fp16_train_and_fp16_saves_its_scaler(tmp_path: Path, demo_dataset: Path) -> None:
    os.environ["LR_TEST_DATASET"] = str(demo_dataset)
    common = ["--steps=30", "--batch_size=8", "--parallelism.dp_shard=2", "--optimizer.lr=0.003", "--save_freq=30"]
    bf16 = train(tmp_path, "bf16", 2, *common, "--accelerator.mixed_precision=bf16")
    fp16 = train(tmp_path, "fp16", 2, *common, "--accelerator.mixed_precision=fp16")
    for run in (bf16, fp16):
        values = losses(run)
        assert sum(values[-5:]) / 5 < 0.8 * sum(values[:5]) / 5, (run.name, values)
    scaler = json.loads((fp16 / "checkpoints" / "000030" / "training_state" / "scaler_state.json").read_text())
    assert scaler["scale"] > 0
    assert not (bf16 / "checkpoints" / "000030" / "training_state" / "scaler_state.json").exists()
    master = load_file(str(fp16 / "checkpoints" / "000030" / "pretrained_model" / "model.safetensors"))
    assert all(t.dtype == torch.float32 for t in master.values())


def test_policy_dtype_bfloat16_trains_sharded_in_bfloat16_weights_and_a_resume_keeps_it(tmp_path: Path, demo_dataset: Path) -> None:
    """--policy.dtype=bfloat16 under FSDP2-2 without autocast: the weights, gradients and the
    saved model are bfloat16, the loss falls, config.json stays LeRobot's (the dtype is in
    lr_policy.json), and a resume in another dtype is refused before anything runs."""
    os.environ["LR_TEST_DATASET"] = str(demo_dataset)
    run = train(tmp_path, "bf16w", 2, "--steps=20", "--batch_size=8", "--parallelism.dp_shard=2", "--optimizer.lr=0.003", "--save_freq=20",
                "--policy.dtype=bfloat16")
    values = losses(run)
    assert all(math.isfinite(v) for v in values) and sum(values[-5:]) / 5 < 0.8 * sum(values[:5]) / 5, values
    step = run / "checkpoints" / "000020"
    assert {t.dtype for t in load_file(str(step / "pretrained_model" / "model.safetensors")).values()} == {torch.bfloat16}
    recorded = json.loads((step / "training_state" / "training_step.json").read_text())
    assert (recorded["param_dtype"], recorded["precision"]) == ("bfloat16", "no")
    assert "dtype" not in json.loads((step / "pretrained_model" / "config.json").read_text())
    assert json.loads((step / "pretrained_model" / "lr_policy.json").read_text())["dtype"] == "bfloat16"
    proc = run_cli(["lr_engine.cli", "train", "--resume=true", f"--config_path={step}", "--steps=21", "--parallelism.dp_shard=1",
                    "--policy.dtype=float32"])
    assert proc.returncode == 2 and "--policy.dtype: " in proc.stderr and "resume with --policy.dtype=bfloat16" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_fp16_overflow_on_one_rank_is_skipped_on_every_rank(tmp_path: Path, demo_dataset: Path) -> None:
    """An inf in rank 1's gradient shard at loop step 12: every rank must skip that update.

    If only rank 1 skipped, rank 0's shard would move and the gathered weights after step 12
    would differ from those after step 11. The first steps overflow by themselves (ACT's first
    decoder layer normalizes a zero vector at initialization, whose gradient overflows
    GradScaler's first scales): here steps 1-6 and 8 do, and steps 9-11 are good ones.
    """
    os.environ["LR_TEST_DATASET"] = str(demo_dataset)
    flags = ["--steps=12", "--batch_size=4", "--parallelism.dp_shard=2", "--accelerator.mixed_precision=fp16", "--save_freq=1",
             "--checkpoint_keep=2"]
    hit = train(tmp_path, "inf", 2, *flags, env={"LR_TEST_INF_GRAD_STEP": "11", "LR_TEST_INF_GRAD_RANK": "1"})
    logged = [r["info"] for r in records(hit)]
    assert logged[10]["skipped_updates"] == logged[9]["skipped_updates"], [r["skipped_updates"] for r in logged]  # step 11 was good
    assert logged[11]["skipped_updates"] == logged[10]["skipped_updates"] + 1
    assert logged[11]["loss_scale"] < logged[10]["loss_scale"]
    before = load_file(str(hit / "checkpoints" / "000011" / "pretrained_model" / "model.safetensors"))
    after = load_file(str(hit / "checkpoints" / "000012" / "pretrained_model" / "model.safetensors"))
    assert all(torch.equal(before[k], after[k]) for k in before)
    # the skip restarts the count of good steps towards the next growth of the scale, as GradScaler's own skip does
    trackers = [json.loads((hit / "checkpoints" / f"0000{i}" / "training_state" / "scaler_state.json").read_text())["_growth_tracker"]
                for i in (11, 12)]
    assert trackers[0] >= 1 and trackers[1] == 0, trackers
    # the count of skipped updates carries over a resume (on one process here); it once restarted at 0
    resumed = tmp_path / "inf-resumed"
    proc = run_cli(["lr_engine.cli", "train", "--resume=true", f"--config_path={hit / 'checkpoints' / '000012'}", f"--output_dir={resumed}",
                    "--steps=13", "--parallelism.dp_replicate=1", "--parallelism.dp_shard=1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    after_resume = records(resumed)
    assert after_resume[-1]["step"] == 13 and after_resume[-1]["info"]["skipped_updates"] >= logged[11]["skipped_updates"]


def test_no_wrap_units_fails_at_start_up_naming_the_options(tmp_path: Path, demo_dataset: Path) -> None:
    out = tmp_path / "mlp"
    proc = run_ranks(2, ["train", f"--output_dir={out}", f"--dataset.root={demo_dataset}", "--policy.type=mlp", "--parallelism.dp_shard=2", "--steps=2"])
    assert proc.returncode != 0
    assert "--accelerator.fsdp.wrap_modules" in proc.stderr and "--accelerator.fsdp.min_num_params" in proc.stderr
    assert "_fsdp_wrap_modules" in proc.stderr
    assert not (out / "checkpoints").exists()


def test_bad_degrees_for_the_launched_world(tmp_path: Path, demo_dataset: Path) -> None:
    proc = run_torchrun(2, ["train", f"--output_dir={tmp_path / 'x'}", f"--dataset.root={demo_dataset}", "--parallelism.dp_shard=4"])
    assert proc.returncode != 0
    assert "1 x 4 = 4, but 2 processes will run" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_a_rank_that_raises_ends_the_job_promptly(tmp_path: Path, demo_dataset: Path) -> None:
    """Rank 1 raises at step 3; rank 0 waits in a collective. The collective timeout stays at its
    default (LR_DIST_TIMEOUT_S unset: 300 s), so a job that ended only because rank 0's collective
    timed out would take 300 s and fail the 60 s bound: the failing rank must end the job itself."""
    proc = run_torchrun(
        2,
        ["train", f"--output_dir={tmp_path / 'r'}", f"--dataset.root={demo_dataset}", *TINY, "--steps=50", "--parallelism.dp_shard=2"],
        env={"LR_TEST_RAISE_AT_STEP": "3", "LR_TEST_RAISE_RANK": "1"},
        timeout=120,
    )
    ended = time.time()
    assert proc.returncode != 0
    match = re.search(r"test fault injected on rank 1 at step 3 \(t=([0-9.]+)\)", proc.stderr)
    assert match, proc.stderr[-2000:]
    assert ended - float(match.group(1)) < 60
    run = json.loads((tmp_path / "r" / "run.json").read_text())
    assert run["status"] in ("running", "failed")


def test_accelerate_launch_is_a_plain_launcher(tmp_path: Path, demo_dataset: Path) -> None:
    import subprocess
    import sys

    from _support.procs import subprocess_env

    out = tmp_path / "acc"
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes=2", "--mixed_precision=no",
        "-m", "lr_engine.cli", "train", f"--output_dir={out}", f"--dataset.root={demo_dataset}", *TINY,
        "--steps=3", "--batch_size=4", "--parallelism.dp_shard=2", "--save_checkpoint=false",
    ]
    proc = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FSDP2 dp_replicate=1 dp_shard=2 world=2" in proc.stdout
    assert len(losses(out)) == 3


def test_accelerate_env_that_reconfigures_is_refused_under_torchrun(tmp_path: Path, demo_dataset: Path) -> None:
    proc = run_torchrun(2, ["train", f"--output_dir={tmp_path / 'e'}", f"--dataset.root={demo_dataset}"], env={"ACCELERATE_USE_FSDP": "true"})
    assert proc.returncode != 0
    assert "ACCELERATE_USE_FSDP" in proc.stderr and "LR_ALLOW_ACCELERATE_ENV=1" in proc.stderr
    assert not (tmp_path / "e").exists()


def test_acknowledged_accelerate_env_applies_and_is_written_down(tmp_path: Path, demo_dataset: Path) -> None:
    """With the guide's override (LeRobot's name; lr's own is checked in lr-config's tests), accelerate's
    FSDP and precision variables apply (they were ignored):
    the run is FSDP2 in bf16, says which variables mapped to which flags, and train_config.json
    records them, so the file still describes the run."""
    out = tmp_path / "acc-env"
    proc = run_ranks(2, ["train", f"--output_dir={out}", f"--dataset.root={demo_dataset}", *TINY, "--steps=2", "--batch_size=4",
                         "--save_checkpoint=false"],
                        env={"LEROBOT_ALLOW_ACCELERATE_ENV": "1", "ACCELERATE_USE_FSDP": "true", "ACCELERATE_MIXED_PRECISION": "bf16"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("accelerate's environment applied (its override is set): ACCELERATE_MIXED_PRECISION=bf16 -> "
            "--accelerator.mixed_precision=bf16; ACCELERATE_USE_FSDP=true -> --parallelism.dp_shard=-1") in proc.stdout
    assert "FSDP2 dp_replicate=1 dp_shard=2 world=2" in proc.stdout
    config = json.loads((out / "train_config.json").read_text())
    assert config["accelerator"]["mixed_precision"] == "bf16" and config["parallelism"]["dp_shard"] == -1
