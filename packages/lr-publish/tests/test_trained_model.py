"""publish_trained_model: 2-process FSDP2 on gloo, and a single-process LoRA model."""

from __future__ import annotations

import json
from pathlib import Path

import peft
import pytest
import torch
from huggingface_hub import ModelCard
from lr_config import DatasetConfig, MLPConfig, PeftConfig, TrainConfig, TrainingStep, save_json
from lr_publish import publish_trained_model
from safetensors.torch import load, load_file
from torch import nn

WORKER = Path(__file__).with_name("_fsdp_publish_worker.py")


def _toy_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))  # even rows: each rank holds exactly half


@pytest.mark.multiprocess
def test_fsdp2_two_ranks_publish_once_from_the_main_rank(hub_server, hub_env, ckpts, ranks, tmp_path):
    (tmp_path / "existing").mkdir()
    dataset = ckpts.write_dataset(tmp_path / "dataset")
    run = ranks(2, [str(WORKER), str(tmp_path), hub_server.endpoint, str(dataset)], module=None, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    by_rank = {r: [json.loads(line) for line in (tmp_path / f"rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)}

    full = sum(p.numel() for p in _toy_model().parameters())
    assert [line["local_numel"] for r in (0, 1) for line in by_rank[r] if "local_numel" in line] == [full // 2] * 2
    # a main-rank failure reaches only the main rank, and nobody hangs
    assert "already exists" in next(line["error"] for line in by_rank[0] if line.get("folder") == "existing")
    assert {"folder": "existing", "url": None} in by_rank[1]
    # then the model lands exactly once, pushed by the main rank
    url = f"{hub_server.endpoint}/lr-test/fsdp_toy"
    assert {"folder": "publish", "url": url} in by_rank[0]
    assert {"folder": "publish", "url": None} in by_rank[1]
    assert hub_server.paths_requested().count("/api/repos/create") == 1
    assert len(hub_server.repos["lr-test/fsdp_toy"].commits) == 1
    assert sorted(p.name for p in tmp_path.glob("write_pretrained-rank*")) == ["write_pretrained-rank0"]

    files = hub_server.files("lr-test/fsdp_toy")
    assert set(files) == {"README.md", "config.json", "model.safetensors", "policy_preprocessor.json", "train_config.json"}
    pushed = load(files["model.safetensors"])
    expected = _toy_model().state_dict()
    assert pushed.keys() == expected.keys()
    for key, tensor in expected.items():
        assert torch.equal(pushed[key], tensor), key
    assert ModelCard(files["README.md"].decode()).data.to_dict()["tags"] == ["mlp", "lr", "robotics"]
    assert "FSDP2 dp_replicate=1 dp_shard=2 world=2" in files["README.md"].decode()
    assert ckpts.secret not in run.stdout + run.stderr


def test_lora_model_publishes_adapter_files(hub_server, hub_env, ckpts, tmp_path):
    base = tmp_path / "base_policy"
    base.mkdir()
    model = peft.get_peft_model(_toy_model(), peft.LoraConfig(r=2, target_modules=["0", "2"]))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_()  # a trained adapter, not the zero init
    cfg = TrainConfig(dataset=DatasetConfig(root=ckpts.write_dataset(tmp_path / "dataset")),
                      policy=MLPConfig(repo_id="lr-test/lora_toy", path=base), peft=PeftConfig(method_type="LORA", r=2))

    url = publish_trained_model(
        model, train_config=cfg, training_step=TrainingStep(step=5), repo_id="lr-test/lora_toy",
        write_pretrained=lambda d: save_json(d / "config.json", {"version": 1, "type": "mlp"}),
        endpoint=hub_server.endpoint, folder=tmp_path / "publish",
    )

    assert url == f"{hub_server.endpoint}/lr-test/lora_toy"
    files = hub_server.files("lr-test/lora_toy")
    assert "model.safetensors" not in files
    adapter = load(files["adapter_model.safetensors"])
    expected = peft.get_peft_model_state_dict(model)
    assert adapter.keys() == expected.keys() and all("lora_" in k for k in adapter)
    for key, tensor in expected.items():
        assert torch.equal(adapter[key], tensor), key
    assert json.loads(files["adapter_config.json"])["base_model_name_or_path"] == str(base)
    card = files["README.md"].decode()
    assert "base_model" not in ModelCard(card).data.to_dict()  # a local path is not a Hub id
    assert str(base) in card
    assert load_file(str(tmp_path / "publish" / "adapter_model.safetensors")).keys() == expected.keys()
