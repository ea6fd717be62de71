"""Toy model, training and reference snapshots shared by the tests and the torchrun worker.

The model is a stack of Linear blocks with odd widths (so 2-, 3- and 4-way shards are
uneven) and a non-trainable buffer. `snapshot` writes the full weights and optimizer
state with plain torch and safetensors calls (DTensor.full_tensor, optimizer.state),
independently of lr_checkpoint, so tests compare our loads against it bit for bit.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from lr_config import Topology, TrainConfig, TrainingStep

DIM = 18


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(DIM, DIM)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x)) * self.scale


class Toy(nn.Module):
    def __init__(self, blocks: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.head = nn.Linear(DIM, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_model(seed: int) -> Toy:
    torch.manual_seed(seed)
    return Toy()


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    rest = [p for n, p in model.named_parameters() if not n.endswith("weight")]
    return torch.optim.AdamW([{"params": decay}, {"params": rest, "weight_decay": 0.0}], lr=1e-2, weight_decay=0.1)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, rank: int, seed: int = 7) -> None:
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    for _ in range(steps):
        x = torch.randn(4, DIM, generator=gen)
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def shard_model(model: nn.Module, mesh: Any) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:  # type: ignore[union-attr]
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().clone()


def _plain(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)


def reference(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Full weights, buffers and optimizer state, from torch's own APIs (collective)."""
    plain = _plain(model)
    out = {f"model.{n}": _full(t) for n, t in plain.named_parameters()}
    out.update({f"model.{n}": _full(t) for n, t in plain.named_buffers()})
    names = {id(p): n for n, p in plain.named_parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state[p].items():
                out[f"optim.{names[id(p)]}.{key}"] = _full(value)
    return out


def snapshot(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, rank: int) -> None:
    """Collective when distributed: rank 0 writes, every rank returns once it is written."""
    import torch.distributed as dist

    ref = reference(model, optimizer)
    if rank == 0:
        save_file({k: v.contiguous() for k, v in ref.items()}, str(path))
    if dist.is_initialized():
        dist.barrier()


def assert_matches(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, where: str) -> None:
    """Weights, buffers and optimizer state equal the snapshot at `path`, bit for bit."""
    expected = load_file(str(path))
    got = reference(model, optimizer)
    assert sorted(got) == sorted(expected), f"{where}: keys differ {sorted(set(got) ^ set(expected))}"
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), f"{where}: {key} differs"


def train_config(fmt: str = "safetensors", keep: int = 0, background: bool = False) -> TrainConfig:
    cfg = TrainConfig()
    cfg.checkpoint_format = fmt  # type: ignore[assignment]
    cfg.checkpoint_keep = keep
    cfg.checkpoint_async = background
    return cfg


def write_config(folder: Path) -> None:
    (folder / "config.json").write_text(json.dumps({"type": "toy", "dim": DIM}) + "\n")


def topology(model: nn.Module) -> Topology:
    """The layout this process runs, as the engine would record it."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    world = dist.get_world_size() if dist.is_initialized() else 1
    weight = next(model.parameters())
    shard = weight.device_mesh.shape[-1] if isinstance(weight, DTensor) else 1
    return Topology(world_size=world, dp_replicate=world // shard, dp_shard=shard)


def request(model: nn.Module, optimizer: torch.optim.Optimizer, step: int, fmt: str = "safetensors", keep: int = 0, background: bool = False) -> Any:
    from lr_checkpoint import SaveRequest

    return SaveRequest(
        model=model,
        optimizer=optimizer,
        train_config=train_config(fmt, keep, background),
        training_step=TrainingStep(step=step, optimizer_updates=step, samples_seen=step * 8, topology=topology(model)),
        scheduler_state={"last_epoch": step, "base_lrs": [0.01, 0.01]},
        scaler_state=None,
        write_pretrained=write_config,
    )


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def draw() -> list[float]:
    return [random.random(), float(np.random.rand()), float(torch.rand(1).item())]
