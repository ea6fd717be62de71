"""The tinyformer policy: what lr-engine builds from `TinyformerConfig`.

Tokens: one per state/environment vector, `image_patches`^2 per camera frame (average-pooled,
then projected), and `chunk_size` learned query tokens. `n_blocks` pre-norm blocks
(`TinyformerBlock`: self-attention, then an MLP) mix them all; a linear head turns each query
token into one action. The loss is lr's padding-masked L1 (`lr_engine.masked_l1`).

The class declares what lr's engine needs to run it in every layout:
- `_fsdp_wrap_modules`: the repeated block, so FSDP2/HSDP shard one block per unit;
- `_fsdp_forward_methods`: the methods besides `forward` that run on the sharded model;
- `_peft_target_modules`: the linears LoRA adapts by default.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from lr_config import PolicyConfigBase
from lr_engine import Policy, masked_l1
from torch import nn

from .config import TinyformerConfig


class TinyformerBlock(nn.Module):
    def __init__(self, cfg: TinyformerConfig) -> None:
        super().__init__()
        d = cfg.dim_model
        self.n_heads = cfg.n_heads
        self.dropout = cfg.dropout
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, cfg.mlp_ratio * d)
        self.fc2 = nn.Linear(cfg.mlp_ratio * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, n, d))
        return x + self.fc2(F.dropout(F.gelu(self.fc1(self.norm2(x))), self.dropout, self.training))


class TinyformerPolicy(Policy):
    config_class: ClassVar[type[PolicyConfigBase]] = TinyformerConfig
    name: ClassVar[str] = "tinyformer"
    _fsdp_wrap_modules: ClassVar[list[str]] = ["TinyformerBlock"]
    _fsdp_forward_methods: ClassVar[list[str]] = ["select_action", "predict_action_chunk"]
    _peft_target_modules: ClassVar[list[str]] = ["qkv", "proj", "fc1", "fc2"]

    def __init__(self, config: PolicyConfigBase) -> None:
        super().__init__(config)
        assert isinstance(config, TinyformerConfig)
        self.cfg = config
        feats = config.input_features or {}
        d = config.dim_model
        self.vector_keys = [k for k, f in feats.items() if f.type in ("STATE", "ENV")]
        self.image_keys = [k for k, f in feats.items() if f.type == "VISUAL"]
        self.vector_in = nn.ModuleList([nn.Linear(feats[k].shape[0], d) for k in self.vector_keys])
        self.image_in = nn.ModuleList([nn.Linear(feats[k].shape[0], d) for k in self.image_keys])
        n_obs = len(self.vector_keys) + len(self.image_keys) * config.image_patches**2
        self.obs_pos = nn.Parameter(torch.zeros(n_obs, d))
        self.queries = nn.Parameter(torch.randn(config.chunk_size, d) * 0.02)
        self.blocks = nn.ModuleList([TinyformerBlock(config) for _ in range(config.n_blocks)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, self.action_dim)

    def _tokens(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = [proj(batch[k])[:, None] for proj, k in zip(self.vector_in, self.vector_keys)]
        for proj, k in zip(self.image_in, self.image_keys):
            cells = F.adaptive_avg_pool2d(batch[k], self.cfg.image_patches).flatten(2).transpose(1, 2)  # [B, P*P, C]
            parts.append(proj(cells))
        obs = torch.cat(parts, dim=1) + self.obs_pos
        return torch.cat([obs, self.queries.expand(obs.shape[0], -1, -1)], dim=1)

    def predict_action_chunk(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        x = self._tokens(batch)
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(self.norm(x[:, -self.cfg.chunk_size :]))
        return out

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = masked_l1(self.predict_action_chunk(batch), batch["action"], batch.get("action_is_pad"))
        return loss, {"l1_loss": loss.detach()}
