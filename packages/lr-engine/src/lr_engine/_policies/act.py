"""ACT: Action Chunking with Transformers (Zhao et al., 2023), written from the paper.

- Inputs become tokens: a latent token, one token per state/environment vector, and one
  token per cell of each image's feature map (a small in-project conv backbone, 2-D
  sinusoidal positions). A transformer encoder (ACTEncoderLayer x n_encoder_layers) mixes
  them; a decoder (ACTDecoderLayer x n_decoder_layers) turns `chunk_size` learned queries
  into the next `chunk_size` actions.
- Training uses a CVAE: an encoder over [CLS, state, actions] gives the latent's mean and
  log-variance; the loss is the padding-masked L1 on actions plus `kl_weight` x KL. At
  inference the latent is zero.
- FSDP units: `ACTEncoderLayer` and `ACTDecoderLayer` (the CVAE encoder reuses the
  encoder layer). Attention uses separate q/k/v/out linears, so LoRA can target them.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from lr_config import ACTConfig, PolicyConfigBase
from torch import nn

from .base import Policy, masked_l1


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(dim, dim)
        # No key bias: softmax ignores a bias shared by every key, so its gradient is exactly
        # zero and Adam would only amplify rounding noise into it.
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        h = self.n_heads

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, -1, h, d // h).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(context)), heads(self.v_proj(context))
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        return self.out_proj(out.transpose(1, 2).reshape(b, n, d))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.linear1 = nn.Linear(dim, hidden)
        self.linear2 = nn.Linear(hidden, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.dropout(F.gelu(self.linear1(x))))


class ACTEncoderLayer(nn.Module):
    """Pre-norm self-attention block."""

    def __init__(self, cfg: ACTConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.dim_model)
        self.self_attn = Attention(cfg.dim_model, cfg.n_heads, cfg.dropout)
        self.norm2 = nn.LayerNorm(cfg.dim_model)
        self.ff = FeedForward(cfg.dim_model, cfg.dim_feedforward, cfg.dropout)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm1(x)
        x = x + self.dropout(self.self_attn(y, y))
        return x + self.dropout(self.ff(self.norm2(x)))


class ACTDecoderLayer(nn.Module):
    """Pre-norm self-attention, cross-attention to the encoder output, feed-forward."""

    def __init__(self, cfg: ACTConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.dim_model)
        self.self_attn = Attention(cfg.dim_model, cfg.n_heads, cfg.dropout)
        self.norm2 = nn.LayerNorm(cfg.dim_model)
        self.cross_attn = Attention(cfg.dim_model, cfg.n_heads, cfg.dropout)
        self.norm3 = nn.LayerNorm(cfg.dim_model)
        self.ff = FeedForward(cfg.dim_model, cfg.dim_feedforward, cfg.dropout)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        y = self.norm1(x)
        x = x + self.dropout(self.self_attn(y, y))
        x = x + self.dropout(self.cross_attn(self.norm2(x), memory))
        return x + self.dropout(self.ff(self.norm3(x)))


class ConvBackbone(nn.Module):
    """Stride-2 conv stages with GroupNorm; [B, 3, H, W] -> [B, C, H/2^n, W/2^n]."""

    def __init__(self, in_channels: int, channels: list[int]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        prev = in_channels
        for c in channels:
            layers += [nn.Conv2d(prev, c, 3, stride=2, padding=1), nn.GroupNorm(min(8, c), c), nn.ReLU()]
            prev = c
        self.stages = nn.Sequential(*layers)
        self.out_channels = prev

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.stages(x)
        return out


def sinusoid_1d(n: int, dim: int) -> torch.Tensor:
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(n, dim)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq[: dim // 2])
    return table


def sinusoid_2d(h: int, w: int, dim: int) -> torch.Tensor:
    """[h*w, dim]: half the channels encode the row, half the column."""
    half = dim // 2
    rows = sinusoid_1d(h, half)[:, None, :].expand(h, w, half)
    cols = sinusoid_1d(w, dim - half)[None, :, :].expand(h, w, dim - half)
    return torch.cat([rows, cols], dim=-1).reshape(h * w, dim)


class ACTPolicy(Policy):
    config_class: ClassVar[type[PolicyConfigBase]] = ACTConfig
    name: ClassVar[str] = "act"
    _fsdp_wrap_modules: ClassVar[list[str]] = ["ACTEncoderLayer", "ACTDecoderLayer"]
    _peft_target_modules: ClassVar[list[str]] = ["q_proj", "k_proj", "v_proj", "out_proj", "linear1", "linear2"]

    def __init__(self, config: PolicyConfigBase) -> None:
        super().__init__(config)
        assert isinstance(config, ACTConfig)
        cfg = config
        feats = config.input_features or {}
        self.vector_keys = [k for k, f in feats.items() if f.type in ("STATE", "ENV")]
        self.image_keys = [k for k, f in feats.items() if f.type == "VISUAL"]
        self.state_key = next((k for k, f in feats.items() if f.type == "STATE"), None)
        d = cfg.dim_model
        self.vector_proj = nn.ModuleDict({_safe(k): nn.Linear(feats[k].shape[0], d) for k in self.vector_keys})
        if cfg.use_vae:
            self.vae_cls = nn.Embedding(1, d)
            self.vae_state_proj = nn.Linear(feats[self.state_key].shape[0], d) if self.state_key else None
            self.vae_action_proj = nn.Linear(self.action_dim, d)
            self.vae_encoder = nn.ModuleList([ACTEncoderLayer(cfg) for _ in range(cfg.n_vae_encoder_layers)])
            self.vae_latent = nn.Linear(d, 2 * cfg.latent_dim)
        self.latent_proj = nn.Linear(cfg.latent_dim, d)
        self.token_pos = nn.Embedding(1 + len(self.vector_keys), d)
        if self.image_keys:
            self.backbone = ConvBackbone(feats[self.image_keys[0]].shape[0], list(cfg.backbone_channels))
            self.image_proj = nn.Conv2d(self.backbone.out_channels, d, 1)
        self.encoder = nn.ModuleList([ACTEncoderLayer(cfg) for _ in range(cfg.n_encoder_layers)])
        self.query_pos = nn.Embedding(cfg.chunk_size, d)
        self.decoder = nn.ModuleList([ACTDecoderLayer(cfg) for _ in range(cfg.n_decoder_layers)])
        self.decoder_norm = nn.LayerNorm(d)
        self.action_head = nn.Linear(d, self.action_dim)
        self.cfg = cfg

    def _latent(self, batch: dict[str, torch.Tensor], bsz: int, sample: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        ref = self.latent_proj.weight
        if not (self.cfg.use_vae and sample):
            return torch.zeros(bsz, self.cfg.latent_dim, device=ref.device, dtype=ref.dtype), None, None
        tokens = [self.vae_cls.weight.expand(bsz, -1)[:, None]]
        if self.vae_state_proj is not None and self.state_key is not None:
            tokens.append(self.vae_state_proj(batch[self.state_key])[:, None])
        tokens.append(self.vae_action_proj(batch["action"]))
        x = torch.cat(tokens, dim=1)
        x = x + sinusoid_1d(x.shape[1], x.shape[2]).to(x.device, x.dtype)
        for layer in self.vae_encoder:
            x = layer(x)
        mu, logvar = self.vae_latent(x[:, 0]).chunk(2, dim=-1)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        return z, mu, logvar

    def _encoder_tokens(self, batch: dict[str, torch.Tensor], z: torch.Tensor) -> torch.Tensor:
        tokens = [self.latent_proj(z)[:, None]]
        tokens += [self.vector_proj[_safe(k)](batch[k])[:, None] for k in self.vector_keys]
        x = torch.cat(tokens, dim=1) + self.token_pos.weight[None]
        parts = [x]
        for key in self.image_keys:
            fmap = self.image_proj(self.backbone(batch[key]))
            b, d, h, w = fmap.shape
            img = fmap.flatten(2).transpose(1, 2) + sinusoid_2d(h, w, d).to(fmap.device, fmap.dtype)
            parts.append(img)
        return torch.cat(parts, dim=1)

    def _decode(self, memory: torch.Tensor) -> torch.Tensor:
        for layer in self.encoder:
            memory = layer(memory)
        q = self.query_pos.weight[None].expand(memory.shape[0], -1, -1)
        for layer in self.decoder:
            q = layer(q, memory)
        out: torch.Tensor = self.action_head(self.decoder_norm(q))
        return out

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        bsz = batch["action"].shape[0]
        z, mu, logvar = self._latent(batch, bsz, sample=self.training)
        pred = self._decode(self._encoder_tokens(batch, z))
        l1 = masked_l1(pred, batch["action"], batch.get("action_is_pad"))
        info = {"l1_loss": l1.detach()}
        loss = l1
        if mu is not None and logvar is not None:
            kld = (-0.5 * (1 + logvar - mu.pow(2) - logvar.exp())).sum(-1).mean()
            loss = l1 + self.cfg.kl_weight * kld
            info["kld_loss"] = kld.detach()
        return loss, info

    def predict_action_chunk(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        bsz = batch[self.vector_keys[0] if self.vector_keys else self.image_keys[0]].shape[0]
        z, _, _ = self._latent(batch, bsz, sample=False)
        return self._decode(self._encoder_tokens(batch, z))


def _safe(key: str) -> str:
    return key.replace(".", "_")
