"""torchrun worker for test_trained_model: publish a toy FSDP2 model from every rank (gloo, CPU).

argv: OUT_DIR ENDPOINT DATASET_ROOT. Each rank appends JSON lines to OUT_DIR/rank<N>.jsonl. The first call
targets a folder that already exists, so it fails on the main rank only: every rank must
still return from it (no hang). The second call publishes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from lr_config import ConfigError, DatasetConfig, MLPConfig, TrainConfig, TrainingStep, Topology, save_json
from lr_publish import publish_trained_model
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

REPO_ID = "lr-test/fsdp_toy"


def toy_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))  # even rows: each rank holds exactly half


def report(out: Path, **fields: object) -> None:
    with open(out / f"rank{dist.get_rank()}.jsonl", "a") as f:
        f.write(json.dumps(fields) + "\n")


def main() -> None:
    out, endpoint, dataset_root = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp_shard",))
    model = toy_model()
    for block in (model[0], model[2]):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    report(out, local_numel=sum(p.to_local().numel() for p in model.parameters()))

    cfg = TrainConfig(steps=3, batch_size=2, dataset=DatasetConfig(repo_id="lr-test/toy_data", root=dataset_root),
                      policy=MLPConfig(repo_id=REPO_ID, push_to_hub=True))
    step = TrainingStep(step=3, dp_world_size=2, batch_size=2, topology=Topology(world_size=2, dp_shard=2))

    def write_pretrained(folder: Path) -> None:
        (out / f"write_pretrained-rank{rank}").write_text(str(folder))
        save_json(folder / "config.json", {"version": 1, "type": "mlp"})
        save_json(folder / "policy_preprocessor.json", {"version": 1})

    existing = out / "existing"
    for folder in (existing, out / "publish"):
        try:
            url = publish_trained_model(model, train_config=cfg, training_step=step, write_pretrained=write_pretrained,
                                        repo_id=REPO_ID, endpoint=endpoint, folder=folder)
            report(out, folder=folder.name, url=url)
        except ConfigError as exc:
            report(out, folder=folder.name, error=str(exc))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
