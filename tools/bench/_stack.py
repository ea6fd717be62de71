"""A plain model of a chosen size for the checkpoint benchmarks, and a SaveRequest for it.

`Stack(dim, blocks)`: `blocks` x Linear(dim, dim); 12 x 2048 gives 50,356,224 parameters
(201.4 MB in fp32), with AdamW state 604 MB in all. `shard` applies FSDP2 per block, then
the root, over every process (the layout `--parallelism.dp_shard=N` gives).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lr_config.layout import POLICY_CONFIG

FULL = {"dim": 2048, "blocks": 12}
SMOKE = {"dim": 256, "blocks": 4}


def make_stack(dim: int, blocks: int, seed: int = 0) -> Any:
    import torch
    from torch import nn

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(blocks))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = torch.tanh(block(x))
            return x

    torch.manual_seed(seed)
    return Stack()


def shard(model: Any) -> Any:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp_shard",))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def build(size: dict[str, int], distributed: bool) -> tuple[Any, Any]:
    """(model, AdamW) after one training step, so the optimizer holds its state."""
    import torch

    model = make_stack(size["dim"], size["blocks"])
    if distributed:
        model = shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    train_step(model, optimizer, size["dim"])
    return model, optimizer


def train_step(model: Any, optimizer: Any, dim: int) -> None:
    import torch

    x = torch.randn(4, dim)
    model(x).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def model_bytes(model: Any) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def save_request(model: Any, optimizer: Any, step: int, fmt: str, background: bool = False) -> Any:
    import torch.distributed as dist
    from lr_checkpoint import SaveRequest
    from lr_config import Topology, TrainConfig, TrainingStep

    cfg = TrainConfig()
    cfg.checkpoint_format = fmt  # type: ignore[assignment]
    cfg.checkpoint_async = background
    world = dist.get_world_size() if dist.is_initialized() else 1
    topo = Topology(world_size=world, dp_replicate=1, dp_shard=world)
    return SaveRequest(
        model=model,
        optimizer=optimizer,
        train_config=cfg,
        training_step=TrainingStep(step=step, optimizer_updates=step, dp_world_size=world, checkpoint_format=fmt, topology=topo),
        scheduler_state={"version": 1, "type": "constant", "last_step": step},
        scaler_state=None,
        write_pretrained=lambda folder: (Path(folder) / POLICY_CONFIG).write_text('{"type": "stack"}\n'),
    )
