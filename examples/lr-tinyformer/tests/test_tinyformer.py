"""The example plugin, installed by the workspace as any package would be: lr finds it through
the `lr.policies` entry point and runs it with no other code.

- discovery, flags, validation and a launch command without torch (a plain interpreter);
- FSDP2 on 2 ranks (DCP checkpoints at steps 2 and 4), resumed from step 2 onto HSDP 2x2 with
  the same global batch: the resumed losses are the straight run's;
- `lr-checkpoint convert` of the sharded checkpoint, then `--policy.path` on the converted
  folder: a LoRA fine-tune under DDP-2 (the policy's `_peft_target_modules`) that evaluates as it
  trains (`--eval_freq`: the main rank's copy carries the adapters), and `lr-engine eval`;
- a single-process run with `--eval_freq`.

Plugins that break the rules (docs/plugins.md) are in `tests/test_plugins.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _support.metrics import losses, records
from _support.procs import run_cli, run_ranks, subprocess_env

pytestmark = pytest.mark.multiprocess

COMMON = ["--policy.type=tinyformer", "--policy.dim_model=32", "--policy.n_heads=2", "--policy.chunk_size=4",
          "--policy.n_action_steps=4", "--scheduler.type=constant", "--scheduler.warmup_steps=0", "--log_freq=1"]
FSDP = ["--batch_size=4", "--parallelism.dp_replicate=1", "--parallelism.dp_shard=2"]
HSDP = ["--batch_size=2", "--parallelism.dp_replicate=2", "--parallelism.dp_shard=2"]


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"{proc.args}\n{proc.stdout[-2500:]}\n{proc.stderr[-2500:]}"
    return proc.stdout


def test_the_plugin_is_found_parsed_and_launched_without_torch() -> None:
    code = """
import sys
from lr_config import LaunchSpec, build_launch, format_command, parse_train_config, policy_types, validate, format_help
assert list(policy_types()) == ["act", "mlp", "tinyformer"], list(policy_types())
cfg = parse_train_config(["--policy.type=tinyformer", "--policy.n_blocks=3", "--parallelism.dp_shard=2"])
assert type(cfg).__name__ == "TrainConfig" and cfg.policy.n_blocks == 3 and cfg.policy.mlp_ratio == 4
print(validate(cfg, world_size=2).layout)
print(format_command(build_launch(LaunchSpec(nproc_per_node=2), cfg)))
text = format_help()
print("help:", "--policy.n_blocks" in text, "[tinyformer] Repeated transformer blocks" in text, "act|mlp|tinyformer" in text)
try:
    validate(parse_train_config(["--policy.type=tinyformer", "--policy.dim_model=30"]))
except Exception as exc:
    print("refused:", exc)
try:
    parse_train_config(["--policy.type=tinyformer", "--policy.n_block=3"])
except Exception as exc:
    print("refused:", exc)
assert "torch" not in sys.modules
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env(), timeout=120)
    out = ok(proc)
    assert out.splitlines()[0] == "fsdp2"
    assert "--policy.type=tinyformer" in out and "--policy.n_blocks=3" in out
    assert "help: True True True" in out
    assert "--policy.dim_model: must be divisible by --policy.n_heads (4), got 30" in out
    assert "--policy.n_block" in out and "did you mean '--policy.n_blocks'" in out


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory: pytest.TempPathFactory, demo_dataset: Path) -> Path:
    out = tmp_path_factory.mktemp("tinyformer") / "fsdp"
    printed = ok(run_ranks(2, ["train", f"--output_dir={out}", f"--dataset.root={demo_dataset}", *COMMON, *FSDP,
                               "--steps=4", "--save_freq=2", "--checkpoint_format=dcp"]))
    assert "tinyformer policy" in printed
    return out


def test_fsdp2_shards_the_declared_blocks_and_resumes_onto_hsdp(fsdp_run: Path, tmp_path: Path) -> None:
    saved = json.loads((fsdp_run / "checkpoints" / "000004" / "pretrained_model" / "train_config.json").read_text())
    assert saved["policy"]["type"] == "tinyformer" and saved["policy"]["n_blocks"] == 2
    plan = ok(run_cli(["lr_engine.cli", "train", "--dry_run=true", "--world_size=2", *COMMON, *FSDP]))
    assert "TinyformerBlock" in plan, plan
    config = fsdp_run / "checkpoints" / "000002" / "pretrained_model" / "train_config.json"
    moved = tmp_path / "hsdp"
    ok(run_ranks(4, ["train", "--resume=true", f"--config_path={config}", f"--output_dir={moved}", *HSDP]))
    assert len(losses(moved)) == 2
    assert losses(moved) == pytest.approx(losses(fsdp_run)[2:], rel=1e-5)


def test_a_converted_checkpoint_fine_tunes_with_lora_and_evaluates(fsdp_run: Path, tmp_path: Path, demo_dataset: Path) -> None:
    step = tmp_path / "000004"
    import shutil

    shutil.copytree(fsdp_run / "checkpoints" / "000004", step)
    ok(run_cli(["lr_checkpoint.cli", "convert", str(step)]))
    model = step / "pretrained_model"
    assert (model / "model.safetensors").exists()
    lora = tmp_path / "lora"
    ok(run_ranks(2, ["train", f"--policy.path={model}", f"--output_dir={lora}", f"--dataset.root={demo_dataset}",
                     "--peft.method_type=LORA", "--peft.r=4", "--steps=2", "--batch_size=4", "--log_freq=1", "--parallelism.dp_replicate=2",
                     "--eval_freq=2", "--eval.n_episodes=2", "--env.max_episode_steps=4"]))
    assert records(lora)[-1]["eval"]["n_episodes"] == 2  # the main rank's copy of the policy carries the adapters
    adapters = json.loads((lora / "pretrained_model" / "adapter_config.json").read_text())
    assert set(adapters["target_modules"]) == {"qkv", "proj", "fc1", "fc2"}
    done = ok(run_cli(["lr_engine.cli", "eval", f"--policy.path={model}", "--eval.n_episodes=2", "--env.max_episode_steps=8",
                       f"--output_dir={tmp_path / 'eval'}"]))
    info = json.loads((tmp_path / "eval" / "eval_info.json").read_text())
    assert info["aggregate"]["n_episodes"] == 2, done


def test_a_single_process_run_evaluates_while_it_trains(tmp_path: Path, demo_dataset: Path) -> None:
    out = tmp_path / "single"
    printed = ok(run_cli(["lr_engine.cli", "train", f"--output_dir={out}", f"--dataset.root={demo_dataset}", *COMMON, "--steps=2",
                          "--batch_size=4", "--eval_freq=2", "--eval.n_episodes=2", "--env.max_episode_steps=4"]))
    assert "eval at step 2: 2 episodes" in printed
    assert json.loads((out / "run.json").read_text())["status"] == "finished"
