"""A plain MLP baseline: current observation -> one action chunk.

It declares no FSDP wrap units on purpose: sharding it needs
`--accelerator.fsdp.wrap_modules` or `--accelerator.fsdp.min_num_params`. Images, when
present, are average-pooled to 4x4 and flattened.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from lr_config import MLPConfig, PolicyConfigBase
from torch import nn

from .base import Policy, masked_l1


class MLPBlock(nn.Module):
    def __init__(self, dim_in: int, dim_out: int, dropout: float) -> None:
        super().__init__()
        self.linear = nn.Linear(dim_in, dim_out)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(F.relu(self.linear(x)))


class MLPPolicy(Policy):
    config_class: ClassVar[type[PolicyConfigBase]] = MLPConfig
    name: ClassVar[str] = "mlp"
    _fsdp_wrap_modules: ClassVar[list[str]] = []
    _peft_target_modules: ClassVar[list[str]] = ["linear"]

    def __init__(self, config: PolicyConfigBase) -> None:
        super().__init__(config)
        assert isinstance(config, MLPConfig)
        feats = config.input_features or {}
        self.vector_keys = [k for k, f in feats.items() if f.type in ("STATE", "ENV")]
        self.image_keys = [k for k, f in feats.items() if f.type == "VISUAL"]
        dim_in = sum(feats[k].shape[0] for k in self.vector_keys) + sum(feats[k].shape[0] * 16 for k in self.image_keys)
        dims = [dim_in] + [config.hidden_dim] * config.n_layers
        self.blocks = nn.ModuleList([MLPBlock(a, b, config.dropout) for a, b in zip(dims[:-1], dims[1:])])
        self.head = nn.Linear(dims[-1], config.chunk_size * self.action_dim)
        self.chunk_size = config.chunk_size

    def predict_action_chunk(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = [batch[k] for k in self.vector_keys]
        parts += [F.adaptive_avg_pool2d(batch[k], 4).flatten(1) for k in self.image_keys]
        x = torch.cat(parts, dim=-1)
        for block in self.blocks:
            x = block(x)
        return self.head(x).view(x.shape[0], self.chunk_size, self.action_dim)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        pred = self.predict_action_chunk(batch)
        loss = masked_l1(pred, batch["action"], batch.get("action_is_pad"))
        return loss, {"l1_loss": loss.detach()}
