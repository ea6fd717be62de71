"""LoRA through the real engine: single process, DDP, FSDP2 and HSDP; adapter-only checkpoints
in every format; resume; conversion; the low-precision-base error."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from _support.metrics import grad_norms, losses
from _support.procs import run_cli, run_ranks

pytestmark = pytest.mark.multiprocess

WORKER = Path(__file__).parent / "workers" / "peft_worker.py"
MODEL = ["--policy.dim_model=32", "--policy.dim_feedforward=64", "--policy.n_heads=2", "--policy.chunk_size=5", "--policy.n_action_steps=5"]
LORA = [
    "--peft.method_type=LORA", "--peft.r=4", "--peft.full_training_modules=[\"action_head\"]",
    "--scheduler.type=constant", "--scheduler.warmup_steps=0", "--log_freq=1", "--optimizer.lr=0.01",
]


def ok(proc) -> None:
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, demo_dataset: Path) -> Path:
    """A small deterministic ACT to adapt (no CVAE, no dropout, so layouts compare exactly)."""
    out = tmp_path_factory.mktemp("peft") / "base"
    ok(run_cli(["lr_engine.cli", "train", f"--output_dir={out}", f"--dataset.root={demo_dataset}", *MODEL,
                "--policy.use_vae=false", "--policy.dropout=0", "--steps=4", "--batch_size=8", "--save_checkpoint=false"]))
    return out / "pretrained_model"


@pytest.fixture(scope="module")
def lora_runs(base: Path, tmp_path_factory: pytest.TempPathFactory, demo_dataset: Path) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("lora")
    common = [f"--policy.path={base}", f"--dataset.root={demo_dataset}", *LORA, "--steps=6"]
    single = tmp / "single"
    ok(run_cli(["lr_engine.cli", "train", f"--output_dir={single}", *common, "--batch_size=8", "--save_checkpoint=false"]))
    fsdp = tmp / "fsdp"
    result = tmp / "fsdp.json"
    ok(run_ranks(2, [str(WORKER), str(result), f"--output_dir={fsdp}", *common, "--batch_size=4",
                        "--parallelism.dp_shard=2", "--checkpoint_format=dcp", "--save_freq=3"], module=None))
    return {"single": single, "fsdp": fsdp, "fsdp_result": result}


def test_lora_fsdp2_matches_single_process(lora_runs: dict[str, Path]) -> None:
    assert len(losses(lora_runs["single"])) == 6
    assert losses(lora_runs["fsdp"]) == pytest.approx(losses(lora_runs["single"]), rel=1e-5)
    assert grad_norms(lora_runs["fsdp"]) == pytest.approx(grad_norms(lora_runs["single"]), rel=1e-5)
    assert losses(lora_runs["single"])[-1] < losses(lora_runs["single"])[0]


def test_only_adapters_and_full_training_modules_change(lora_runs: dict[str, Path]) -> None:
    result = json.loads(lora_runs["fsdp_result"].read_text())
    assert result["base_checked"] == result["base_total"] and not result["unmatched"]
    assert result["base_changed"] == []
    assert any("lora_A" in n for n in result["trainable"]) and any("modules_to_save" in n for n in result["trainable"])
    assert all("lora_" in n or "modules_to_save" in n for n in result["trainable"])
    assert result["unchanged_trainable"] == []


def test_saved_adapter_reloaded_on_the_base_reproduces_the_model(lora_runs: dict[str, Path]) -> None:
    result = json.loads(lora_runs["fsdp_result"].read_text())
    assert result["outputs_equal"] is True and result["unexpected"] == []
    final = lora_runs["fsdp"] / "pretrained_model"
    assert (final / "adapter_model.safetensors").exists() and not (final / "model.safetensors").exists()
    config = json.loads((final / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"].endswith("pretrained_model") and config["r"] == 4


def test_checkpoints_hold_only_adapters_and_convert_merges_them(lora_runs: dict[str, Path]) -> None:
    step = lora_runs["fsdp"] / "checkpoints" / "000006"
    assert (step / "pretrained_model" / "pytorch_model_fsdp_0" / ".metadata").exists()
    assert not (step / "pretrained_model" / "model.safetensors").exists()
    proc = run_cli(["lr_checkpoint.cli", "convert", f"--checkpoint_dir={step}"])
    ok(proc)
    converted = load_file(str(step / "pretrained_model" / "adapter_model.safetensors"))
    gathered = load_file(str(lora_runs["fsdp"] / "pretrained_model" / "adapter_model.safetensors"))
    assert converted.keys() == gathered.keys()
    assert all(torch.equal(converted[k], gathered[k]) for k in gathered)
    assert all("lora_" in k or "modules_to_save" in k for k in converted)


def test_lora_resume_is_exact_on_the_same_topology_and_reshards_to_one(lora_runs: dict[str, Path], tmp_path: Path) -> None:
    config = lora_runs["fsdp"] / "checkpoints" / "000003" / "pretrained_model" / "train_config.json"
    same = tmp_path / "same"
    ok(run_ranks(2, ["train", "--resume=true", f"--config_path={config}", f"--output_dir={same}"]))
    assert len(losses(same)) == 3
    assert losses(same) == losses(lora_runs["fsdp"])[3:]
    assert grad_norms(same) == grad_norms(lora_runs["fsdp"])[3:]
    a = load_file(str(same / "pretrained_model" / "adapter_model.safetensors"))
    b = load_file(str(lora_runs["fsdp"] / "pretrained_model" / "adapter_model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in b)
    one = tmp_path / "one"
    ok(run_cli(["lr_engine.cli", "train", "--resume=true", f"--config_path={config}", f"--output_dir={one}", "--batch_size=8",
                "--parallelism.dp_replicate=1", "--parallelism.dp_shard=1", "--checkpoint_format=safetensors"]))
    assert losses(one) == pytest.approx(losses(lora_runs["fsdp"])[3:], rel=1e-5)
    assert grad_norms(one) == pytest.approx(grad_norms(lora_runs["fsdp"])[3:], rel=1e-5)


def test_ddp_lora_saves_the_same_adapter_as_single_process(lora_runs: dict[str, Path], base: Path, tmp_path: Path,
                                                           demo_dataset: Path) -> None:
    """DDP names parameters `module.*`; the final adapter must still hold every trained tensor
    (it was once written empty), equal to the single-process run's, as its checkpoint's is."""
    out = tmp_path / "ddp"
    ok(run_ranks(2, ["train", f"--output_dir={out}", f"--policy.path={base}", f"--dataset.root={demo_dataset}", *LORA,
                        "--steps=6", "--batch_size=4", "--save_freq=6"]))
    assert losses(out) == pytest.approx(losses(lora_runs["single"]), rel=1e-5)
    assert grad_norms(out) == pytest.approx(grad_norms(lora_runs["single"]), rel=1e-5)
    single = load_file(str(lora_runs["single"] / "pretrained_model" / "adapter_model.safetensors"))
    for folder in (out / "pretrained_model", out / "checkpoints" / "000006" / "pretrained_model"):
        ddp = load_file(str(folder / "adapter_model.safetensors"))
        assert ddp.keys() == single.keys() and len(ddp) > 0, folder
        assert all(torch.allclose(ddp[k], single[k], rtol=1e-4, atol=1e-6) for k in single), folder


def test_hsdp_lora_matches_single_process(lora_runs: dict[str, Path], base: Path, tmp_path: Path, demo_dataset: Path) -> None:
    """HSDP 2x2 with batch 2 per rank is the single process's global batch of 8: the same losses,
    pre-clip grad norms and adapters."""
    out = tmp_path / "hsdp"
    ok(run_ranks(4, ["train", f"--output_dir={out}", f"--policy.path={base}", f"--dataset.root={demo_dataset}", *LORA,
                        "--steps=6", "--batch_size=2", "--parallelism.dp_replicate=2", "--parallelism.dp_shard=2", "--save_checkpoint=false"]))
    assert len(losses(out)) == 6
    assert losses(out) == pytest.approx(losses(lora_runs["single"]), rel=1e-5)
    assert grad_norms(out) == pytest.approx(grad_norms(lora_runs["single"]), rel=1e-5)
    single = load_file(str(lora_runs["single"] / "pretrained_model" / "adapter_model.safetensors"))
    hsdp = load_file(str(out / "pretrained_model" / "adapter_model.safetensors"))
    assert hsdp.keys() == single.keys() and len(hsdp) > 0
    for key in single:
        torch.testing.assert_close(hsdp[key], single[key], rtol=1e-4, atol=1e-6, msg=key)


def test_bf16_base_without_mixed_precision_is_a_start_up_error(base: Path, tmp_path: Path, demo_dataset: Path) -> None:
    low = tmp_path / "bf16_base"
    low.mkdir()
    (low / "config.json").write_text((base / "config.json").read_text())
    save_file({k: v.to(torch.bfloat16) for k, v in load_file(str(base / "model.safetensors")).items()}, str(low / "model.safetensors"))
    proc = run_cli(["lr_engine.cli", "train", f"--output_dir={tmp_path / 'x'}", f"--policy.path={low}", f"--dataset.root={demo_dataset}", *LORA, "--steps=2"])
    assert proc.returncode == 2
    assert "--accelerator.mixed_precision" in proc.stderr and "bfloat16" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def lora_checkpoints(base: Path, tmp_path_factory: pytest.TempPathFactory, demo_dataset: Path) -> tuple[Path, Path]:
    """(a single-process LoRA run saved at steps 2 and 4, its own copy of the base)."""
    tmp = tmp_path_factory.mktemp("lora_base")
    own_base = Path(shutil.copytree(base, tmp / "base"))
    run = tmp / "run"
    ok(run_cli(["lr_engine.cli", "train", f"--output_dir={run}", f"--policy.path={own_base}", f"--dataset.root={demo_dataset}", *LORA,
                "--steps=4", "--batch_size=8", "--save_freq=2"]))
    return run, own_base


def _resume_lora(run: Path, out: Path):
    return run_cli(["lr_engine.cli", "train", "--resume=true", f"--config_path={run / 'checkpoints' / '000002'}", f"--output_dir={out}"])


def test_a_lora_resume_refuses_a_base_that_changed_or_is_gone(lora_checkpoints: tuple[Path, Path], tmp_path: Path) -> None:
    """The adapters only mean something on the base they were trained on (a base path such as another
    run's checkpoints/last/pretrained_model moves): a changed base was once adapted silently."""
    run, own_base = lora_checkpoints
    weights = own_base / "model.safetensors"
    original = weights.read_bytes()
    try:
        tensors = load_file(str(weights))
        first = sorted(tensors)[0]
        save_file({**tensors, first: tensors[first] + 0.01}, str(weights))  # same shapes, other weights
        changed = _resume_lora(run, tmp_path / "changed")
        assert changed.returncode == 2 and "Traceback" not in changed.stderr, changed.stderr[-3000:]
        assert f"--policy.path: the base model at {own_base} is not the one the adapters of" in changed.stderr
        moved = own_base.rename(own_base.parent / "moved")
        try:
            gone = _resume_lora(run, tmp_path / "gone")
        finally:
            moved.rename(own_base)
        assert gone.returncode == 2 and "Traceback" not in gone.stderr, gone.stderr[-3000:]
        assert "--policy.path:" in gone.stderr and "holds only the adapters" in gone.stderr
    finally:
        weights.write_bytes(original)
    assert not (tmp_path / "changed").exists() and not (tmp_path / "gone").exists()
    record = json.loads((run / "checkpoints" / "000002" / "pretrained_model" / "adapter_base.json").read_text())
    assert record["version"] == 1 and record["sha256"] == hashlib.sha256(original).hexdigest() and record["size"] == len(original)


def test_a_lora_checkpoint_saved_without_a_base_record_resumes_with_a_warning(lora_checkpoints: tuple[Path, Path], tmp_path: Path) -> None:
    from lr_config import load_checksums, save_checksums

    run, _ = lora_checkpoints
    old = Path(shutil.copytree(run, tmp_path / "old", symlinks=True))
    step = old / "checkpoints" / "000002"
    (step / "pretrained_model" / "adapter_base.json").unlink(missing_ok=True)  # as lr wrote checkpoints before the record
    sums = load_checksums(step / "checksums.json")
    save_checksums(step / "checksums.json", replace(sums, files={k: v for k, v in sums.files.items() if "adapter_base" not in k}))
    out = tmp_path / "resumed"
    proc = _resume_lora(old, out)
    ok(proc)
    assert "has no adapter_base.json (saved by an older lr)" in proc.stdout
    assert losses(out) == losses(run)[2:]
    assert (out / "checkpoints" / "000004" / "pretrained_model" / "adapter_base.json").exists()


def test_a_lora_checkpoint_is_a_policy_path_its_adapters_merged_into_its_base(lora_runs: dict[str, Path], tmp_path: Path,
                                                                           demo_dataset: Path) -> None:
    """`--policy.path=<a LoRA run's pretrained_model>` (adapters only) fine-tunes in full from the
    base it records with the adapters merged in; new adapters on it are refused by name."""
    from lr_engine import load_adapter_policy

    adapters = lora_runs["fsdp"] / "pretrained_model"
    merged = {k: v.detach() for k, v in load_adapter_policy(adapters).merge_and_unload().state_dict().items()}
    out = tmp_path / "full"
    still = ["--optimizer.type=sgd", "--optimizer.betas=[0,0.999]", "--optimizer.weight_decay=0", "--optimizer.grad_clip_norm=0",
             "--optimizer.lr=1e-30"]  # weights held still: the run saves what it started from
    ok(run_cli(["lr_engine.cli", "train", f"--policy.path={adapters}", f"--dataset.root={demo_dataset}", f"--output_dir={out}",
                "--steps=1", "--batch_size=4", *still]))
    saved = load_file(str(out / "pretrained_model" / "model.safetensors"))
    assert set(saved) == set(merged)
    for key in merged:
        torch.testing.assert_close(saved[key], merged[key], rtol=0, atol=1e-20, msg=key)
    refused = tmp_path / "lora-on-lora"
    proc = run_cli(["lr_engine.cli", "train", f"--policy.path={adapters}", f"--dataset.root={demo_dataset}", f"--output_dir={refused}",
                    "--steps=1", "--peft.method_type=LORA"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"--policy.path: {adapters} holds LoRA adapters, not a full model" in proc.stderr and not refused.exists()
