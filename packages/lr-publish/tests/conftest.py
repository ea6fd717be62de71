"""Fixtures of lr-publish's tests: real checkpoints on disk, a planted token, fast retries.

`ckpts.make(kind)` writes a checkpoint in the layout lr-checkpoint saves, with real
safetensors files and lr_config dataclasses: `full` (model.safetensors), `adapter` (LoRA
adapter files) or `dcp` (DCP shards only). Every kind also carries DCP shards and
training_state/ files, which must never be uploaded. The dataset is a LeRobot v3
`meta/info.json`, enough for the model card.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from lr_config import (
    ACTConfig,
    DatasetConfig,
    TrainConfig,
    TrainingStep,
    Topology,
    save_json,
    save_training_step,
    to_dict,
)
from safetensors.torch import save_file

SECRET = "hf_test_secret_0123456789abcdefABCDEF"
REPO_ID = "lr-test/act_policy"
STEP = 120
INFO = {
    "codebase_version": "v3.0",
    "fps": 15,
    "robot_type": "toy",
    "total_episodes": 7,
    "total_frames": 420,
    "features": {
        "observation.state": {"dtype": "float32", "shape": [2], "names": ["x", "y"]},
        "observation.images.top": {"dtype": "image", "shape": [32, 32, 3], "names": ["height", "width", "channels"]},
        "action": {"dtype": "float32", "shape": [2], "names": ["dx", "dy"]},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    },
}
TOPOLOGY = Topology(world_size=4, dp_replicate=2, dp_shard=2)


def train_config(dataset_root: Path, **policy: object) -> TrainConfig:
    return TrainConfig(
        steps=300, batch_size=8,
        dataset=DatasetConfig(repo_id="lr-test/reach_dataset", root=dataset_root),
        policy=ACTConfig(repo_id=REPO_ID, push_to_hub=True, license="mit", **policy),  # type: ignore[arg-type]
    )


def training_step(step: int = STEP) -> TrainingStep:
    return TrainingStep(step=step, optimizer_updates=step, samples_seen=step * 32, dp_world_size=4, batch_size=8,
                        precision="bf16", checkpoint_format="safetensors_dcp", seed=1000, topology=TOPOLOGY)


def write_dataset(root: Path) -> Path:
    (root / "meta").mkdir(parents=True)
    (root / "meta" / "info.json").write_text(json.dumps(INFO))
    return root


def weights(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"encoder.weight": torch.randn(64, 32, generator=gen), "encoder.bias": torch.randn(64, generator=gen),
            "head.weight": torch.randn(2, 64, generator=gen)}


def _write_pretrained(model_dir: Path, cfg: TrainConfig, kind: str) -> None:
    model_dir.mkdir(parents=True)
    save_json(model_dir / "config.json", {"version": 1, "type": "act", **to_dict(cfg.policy)})
    save_json(model_dir / "train_config.json", to_dict(cfg))
    save_json(model_dir / "policy_preprocessor.json", {"version": 1, "steps": ["normalizer"]})
    save_json(model_dir / "policy_postprocessor.json", {"version": 1, "steps": ["unnormalizer"]})
    save_file({"observation.state.mean": torch.zeros(2)}, str(model_dir / "policy_preprocessor_step_0_normalizer.safetensors"))
    dcp = model_dir / "pytorch_model_fsdp_0"
    dcp.mkdir()
    (dcp / ".metadata").write_bytes(b"dcp-metadata")
    (dcp / "__0_0.distcp").write_bytes(os.urandom(256))
    if kind == "full":
        save_file(weights(), str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    elif kind == "adapter":
        save_file({"base_model.model.encoder.lora_A.weight": torch.randn(4, 32)}, str(model_dir / "adapter_model.safetensors"))
        save_json(model_dir / "adapter_config.json", {"peft_type": "LORA", "r": 4, "base_model_name_or_path": "lr-test/base_policy"})


def _write_training_state(state_dir: Path, step: int) -> None:
    state_dir.mkdir(parents=True)
    save_training_step(state_dir / "training_step.json", training_step(step))
    save_file({"m": torch.ones(3)}, str(state_dir / "optimizer_state.safetensors"))
    (state_dir / "optimizer_0").mkdir()
    (state_dir / "optimizer_0" / "__0_0.distcp").write_bytes(b"optimizer-shard")


class Checkpoints:
    """Builders and constants for tests (a fixture, since test modules cannot import conftest)."""

    secret = SECRET
    repo_id = REPO_ID
    step = STEP
    info = INFO
    topology = TOPOLOGY
    train_config = staticmethod(train_config)
    training_step = staticmethod(training_step)
    write_dataset = staticmethod(write_dataset)
    weights = staticmethod(weights)

    def __init__(self, root: Path) -> None:
        self.root = root

    def make(self, kind: str = "full", step: int = STEP, run: str = "run") -> Path:
        """A checkpoint of `kind` ("full", "adapter" or "dcp"); returns its step folder."""
        cfg = train_config(write_dataset(self.root / f"{run}_dataset"))
        checkpoints = self.root / run / "checkpoints"
        step_dir = checkpoints / f"{step:06d}"
        _write_pretrained(step_dir / "pretrained_model", cfg, kind)
        _write_training_state(step_dir / "training_state", step)
        (checkpoints / "last").symlink_to(step_dir.name)
        return step_dir


@pytest.fixture
def ckpts(tmp_path: Path) -> Checkpoints:
    return Checkpoints(tmp_path)


@pytest.fixture
def hub_env(hub_server: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted token and fast retries, for in-process calls and subprocesses alike."""
    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.setenv("LR_HUB_RETRY_BASE_S", "0.01")
    monkeypatch.setenv("LR_HUB_RETRIES", "3")
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
