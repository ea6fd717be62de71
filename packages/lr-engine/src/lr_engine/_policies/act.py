"""LeRobot's ACT (Action Chunking with Transformers, Zhao et al., 2023), written for lr.

The module tree, parameter names and shapes, and the forward pass are those of LeRobot
0.6.1's `ACTPolicy` (docs/lerobot-compat.md): the same `model.safetensors` loads in both, and
the same weights and observation give the same actions (`tools/lerobot_compat.py` checks it).

- `model.backbone`: a torchvision-layout ResNet (`conv1`, `bn1`, `layer1`..`layer4`) with
  frozen batch norm (statistics and affine terms are buffers, not trained), up to `layer4`'s
  feature map. Written here, not imported from torchvision: lr then needs no torchvision
  build matched to its torch, and the state dict is the same.
- Tokens: the latent, `observation.state`, `observation.environment_state` (each with a
  learned position), then one token per feature-map cell of each camera (2-D sinusoidal
  positions). Post-norm transformer blocks (`pre_norm=False`, LeRobot's default) built on
  `nn.MultiheadAttention`, its key bias held out of the gradient (`Attention`); positions are
  added to queries and keys in every block.
- Training uses the CVAE: an encoder over [CLS, state, actions] (padded steps masked) gives
  the latent's mean and log-variance; the loss is the padding-masked L1 plus `kl_weight` x KL.
  At inference the latent is zero.
- lr's loss averages each sample's non-padded steps, then the samples (`masked_l1`), so any
  layout, batch split or accumulation gives the same loss; LeRobot averages over the batch's
  valid steps at once. They differ only for batches with padded steps.
- FSDP units: `ACTEncoderLayer` and `ACTDecoderLayer`. LoRA targets the feed-forward linears
  (`nn.MultiheadAttention` reads its projections' weights directly, so an adapter on them
  would be bypassed).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from lr_config import ACTConfig, ConfigError, PolicyConfigBase
from torch import nn

from .base import Policy, masked_l1

OBS_STATE = "observation.state"
OBS_ENV_STATE = "observation.environment_state"


# --- the image backbone: torchvision's ResNet layout with frozen batch norm -----------------


class FrozenBatchNorm2d(nn.Module):
    """Batch norm with fixed statistics and affine terms, all buffers (torchvision's names)."""

    def __init__(self, n: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(n))
        self.register_buffer("bias", torch.zeros(n))
        self.register_buffer("running_mean", torch.zeros(n))
        self.register_buffer("running_var", torch.ones(n))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # type: ignore[no-untyped-def]
        state_dict.pop(prefix + "num_batches_tracked", None)  # a trainable BatchNorm's counter: meaningless here
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        shift = self.bias - self.running_mean * scale
        return x * scale[None, :, None, None] + shift[None, :, None, None]


def _conv(cin: int, cout: int, k: int, stride: int = 1, dilation: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, k, stride=stride, padding=dilation * (k // 2), dilation=dilation, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int, dilation: int, downsample: nn.Module | None) -> None:
        super().__init__()
        if dilation > 1:
            raise ConfigError("--policy.replace_final_stride_with_dilation: resnet18 and resnet34 blocks cannot dilate (as in torchvision); use resnet50")
        self.conv1 = _conv(cin, width, 3, stride)
        self.bn1 = FrozenBatchNorm2d(width)
        self.conv2 = _conv(width, width, 3)
        self.bn2 = FrozenBatchNorm2d(width)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + skip)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int, dilation: int, downsample: nn.Module | None) -> None:
        super().__init__()
        self.conv1 = _conv(cin, width, 1)
        self.bn1 = FrozenBatchNorm2d(width)
        self.conv2 = _conv(width, width, 3, stride, dilation)
        self.bn2 = FrozenBatchNorm2d(width)
        self.conv3 = _conv(width, width * 4, 1)
        self.bn3 = FrozenBatchNorm2d(width * 4)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        return F.relu(self.bn3(self.conv3(out)) + skip)


_RESNETS: dict[str, tuple[type[BasicBlock] | type[Bottleneck], tuple[int, int, int, int]]] = {
    "resnet18": (BasicBlock, (2, 2, 2, 2)),
    "resnet34": (BasicBlock, (3, 4, 6, 3)),
    "resnet50": (Bottleneck, (3, 4, 6, 3)),
}


class ResNetTrunk(nn.Module):
    """A torchvision ResNet up to `layer4` (no pooling, no classifier): [B, 3, H, W] -> [B, C, H/32, W/32]."""

    def __init__(self, name: str, dilate_last: bool) -> None:
        super().__init__()
        block, counts = _RESNETS[name]
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = FrozenBatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        cin = 64
        for i, (width, count) in enumerate(zip((64, 128, 256, 512), counts, strict=True)):
            stride, dilation = (1 if i == 0 else 2), 1
            if i == 3 and dilate_last:  # torchvision: the stage's first block keeps dilation 1, the others dilate
                stride, dilation = 1, 2
            downsample = None
            if stride != 1 or cin != width * block.expansion:
                downsample = nn.Sequential(_conv(cin, width * block.expansion, 1, stride), FrozenBatchNorm2d(width * block.expansion))
            blocks: list[nn.Module] = [block(cin, width, stride, 1, downsample)]
            cin = width * block.expansion
            blocks += [block(cin, width, 1, dilation, None) for _ in range(count - 1)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.out_channels = cin
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        out: torch.Tensor = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return out


# --- the transformer ----------------------------------------------------------------------

_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "glu": F.glu}


class Attention(nn.MultiheadAttention):
    """`nn.MultiheadAttention` (its parameters and names, batch-first), with the key bias out of
    the gradient: softmax ignores a bias shared by every key, so its true gradient is zero, but
    rounding leaves noise there that Adam would amplify into updates, different on every layout
    (one process, DDP, FSDP2). Held out of the graph, it gets exactly zero; outputs are unchanged."""

    def __init__(self, dim: int, n_heads: int, dropout: float) -> None:
        super().__init__(dim, n_heads, dropout=dropout, batch_first=True)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,  # type: ignore[override]
                key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        d = self.embed_dim
        bias = self.in_proj_bias
        assert bias is not None and self.in_proj_weight is not None
        bias = torch.cat([bias[:d], bias[d : 2 * d].detach(), bias[2 * d :]])
        out, _ = F.multi_head_attention_forward(
            query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1), d, self.num_heads, self.in_proj_weight, bias,
            None, None, False, self.dropout, self.out_proj.weight, self.out_proj.bias, training=self.training,
            key_padding_mask=key_padding_mask, need_weights=False,
        )
        return out.transpose(0, 1)


def _with(x: torch.Tensor, pos: torch.Tensor | None) -> torch.Tensor:
    return x if pos is None else x + pos


class ACTEncoderLayer(nn.Module):
    def __init__(self, cfg: ACTConfig) -> None:
        super().__init__()
        d = cfg.dim_model
        self.self_attn = Attention(d, cfg.n_heads, cfg.dropout)
        self.linear1 = nn.Linear(d, cfg.dim_feedforward)
        self.dropout = nn.Dropout(cfg.dropout)
        self.linear2 = nn.Linear(cfg.dim_feedforward, d)
        self.norm1 = nn.LayerNorm(d)
        self.norm2 = nn.LayerNorm(d)
        self.dropout1 = nn.Dropout(cfg.dropout)
        self.dropout2 = nn.Dropout(cfg.dropout)
        self.activation = _ACTIVATIONS[cfg.feedforward_activation]
        self.pre_norm = cfg.pre_norm

    def forward(self, x: torch.Tensor, pos: torch.Tensor | None = None, key_padding_mask: torch.Tensor | None = None,
                rows: int | None = None) -> torch.Tensor:
        """`rows`: compute the outputs of the first `rows` tokens only (every token still serves
        as a key and value); each output row depends only on its own query row, so they equal
        the first rows of the full output."""
        skip = x if rows is None else x[:, :rows]
        if self.pre_norm:
            x = self.norm1(x)
        qk = _with(x, pos)
        x = skip + self.dropout1(self.self_attn(qk if rows is None else qk[:, :rows], qk, x, key_padding_mask=key_padding_mask))
        if self.pre_norm:
            skip, x = x, self.norm2(x)
        else:
            x = skip = self.norm1(x)
        x = skip + self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))
        return x if self.pre_norm else self.norm2(x)


class ACTEncoder(nn.Module):
    def __init__(self, cfg: ACTConfig, n_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([ACTEncoderLayer(cfg) for _ in range(n_layers)])
        self.norm: nn.Module = nn.LayerNorm(cfg.dim_model) if cfg.pre_norm else nn.Identity()

    def forward(self, x: torch.Tensor, pos: torch.Tensor | None = None, key_padding_mask: torch.Tensor | None = None,
                first_only: bool = False) -> torch.Tensor:
        """[B, S, D] -> [B, S, D], or [B, 1, D] (the first token's output) when `first_only`:
        then the last layer computes that row alone. The CVAE encoder reads only its class
        token, and its last layer's other rows (their attention outputs and feed-forward, 101
        of 102 rows with LeRobot's defaults) would be thrown away."""
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x, pos, key_padding_mask, rows=1 if first_only and i == last else None)
        out: torch.Tensor = self.norm(x)
        return out


class ACTDecoderLayer(nn.Module):
    def __init__(self, cfg: ACTConfig) -> None:
        super().__init__()
        d = cfg.dim_model
        self.self_attn = Attention(d, cfg.n_heads, cfg.dropout)
        self.multihead_attn = Attention(d, cfg.n_heads, cfg.dropout)
        self.linear1 = nn.Linear(d, cfg.dim_feedforward)
        self.dropout = nn.Dropout(cfg.dropout)
        self.linear2 = nn.Linear(cfg.dim_feedforward, d)
        self.norm1 = nn.LayerNorm(d)
        self.norm2 = nn.LayerNorm(d)
        self.norm3 = nn.LayerNorm(d)
        self.dropout1 = nn.Dropout(cfg.dropout)
        self.dropout2 = nn.Dropout(cfg.dropout)
        self.dropout3 = nn.Dropout(cfg.dropout)
        self.activation = _ACTIVATIONS[cfg.feedforward_activation]
        self.pre_norm = cfg.pre_norm

    def forward(self, x: torch.Tensor, memory: torch.Tensor, pos: torch.Tensor, memory_pos: torch.Tensor) -> torch.Tensor:
        skip = x
        if self.pre_norm:
            x = self.norm1(x)
        qk = _with(x, pos)
        x = skip + self.dropout1(self.self_attn(qk, qk, x))
        if self.pre_norm:
            skip, x = x, self.norm2(x)
        else:
            x = skip = self.norm1(x)
        x = skip + self.dropout2(self.multihead_attn(_with(x, pos), _with(memory, memory_pos), memory))
        if self.pre_norm:
            skip, x = x, self.norm3(x)
        else:
            x = skip = self.norm2(x)
        x = skip + self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))
        return x if self.pre_norm else self.norm3(x)


class ACTDecoder(nn.Module):
    def __init__(self, cfg: ACTConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList([ACTDecoderLayer(cfg) for _ in range(cfg.n_decoder_layers)])
        self.norm = nn.LayerNorm(cfg.dim_model)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, pos: torch.Tensor, memory_pos: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, memory, pos, memory_pos)
        out: torch.Tensor = self.norm(x)
        return out


def sinusoid_table(n: int, dim: int) -> torch.Tensor:
    """[n, dim]: position p / 10000^(2*(j//2)/dim), sine on even channels, cosine on odd ones."""
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    rate = torch.pow(10000.0, 2 * (torch.arange(dim, dtype=torch.float64) // 2) / dim)
    angle = pos / rate
    angle[:, 0::2] = angle[:, 0::2].sin()
    angle[:, 1::2] = angle[:, 1::2].cos()
    return angle.float()


def sinusoid_2d(h: int, w: int, half: int, device: torch.device) -> torch.Tensor:
    """[h*w, 2*half]: rows then columns, each position scaled to (0, 2*pi], interleaved sine and cosine."""
    eps, two_pi = 1e-6, 2 * math.pi
    ys = torch.arange(1, h + 1, dtype=torch.float32, device=device)
    xs = torch.arange(1, w + 1, dtype=torch.float32, device=device)
    ys = ys / (ys[-1] + eps) * two_pi
    xs = xs / (xs[-1] + eps) * two_pi
    rate = 10000.0 ** (2 * (torch.arange(half, dtype=torch.float32, device=device) // 2) / half)

    def embed(v: torch.Tensor) -> torch.Tensor:  # [n] -> [n, half]
        a = v[:, None] / rate
        return torch.stack((a[:, 0::2].sin(), a[:, 1::2].cos()), dim=-1).flatten(1)

    ey, ex = embed(ys), embed(xs)
    return torch.cat([ey[:, None, :].expand(h, w, half), ex[None, :, :].expand(h, w, half)], dim=-1).reshape(h * w, 2 * half)


class ACT(nn.Module):
    """The network (`ACTPolicy.model`): LeRobot's module names, batch-first tensors."""

    def __init__(self, cfg: ACTConfig, action_dim: int) -> None:
        super().__init__()
        feats = cfg.input_features or {}
        self.cfg = cfg
        self.state_dim = int(feats[OBS_STATE].shape[0]) if OBS_STATE in feats and feats[OBS_STATE].type == "STATE" else 0
        self.env_dim = int(feats[OBS_ENV_STATE].shape[0]) if OBS_ENV_STATE in feats and feats[OBS_ENV_STATE].type == "ENV" else 0
        self.image_keys = [k for k, f in feats.items() if f.type == "VISUAL"]
        if not self.image_keys and not self.env_dim:
            raise ConfigError(f"--policy.input_features: ACT needs a camera or {OBS_ENV_STATE} among its inputs (as LeRobot's), "
                              f"got {', '.join(feats) or 'none'}")
        d = cfg.dim_model
        if cfg.use_vae:
            self.vae_encoder = ACTEncoder(cfg, cfg.n_vae_encoder_layers)
            self.vae_encoder_cls_embed = nn.Embedding(1, d)
            if self.state_dim:
                self.vae_encoder_robot_state_input_proj = nn.Linear(self.state_dim, d)
            self.vae_encoder_action_input_proj = nn.Linear(action_dim, d)
            self.vae_encoder_latent_output_proj = nn.Linear(d, 2 * cfg.latent_dim)
            n_tokens = 1 + cfg.chunk_size + (1 if self.state_dim else 0)
            self.register_buffer("vae_encoder_pos_enc", sinusoid_table(n_tokens, d)[None])
        if self.image_keys:
            self.backbone = ResNetTrunk(cfg.vision_backbone, cfg.replace_final_stride_with_dilation)
        self.encoder = ACTEncoder(cfg, cfg.n_encoder_layers)
        self.decoder = ACTDecoder(cfg)
        if self.state_dim:
            self.encoder_robot_state_input_proj = nn.Linear(self.state_dim, d)
        if self.env_dim:
            self.encoder_env_state_input_proj = nn.Linear(self.env_dim, d)
        self.encoder_latent_input_proj = nn.Linear(cfg.latent_dim, d)
        if self.image_keys:
            self.encoder_img_feat_input_proj = nn.Conv2d(self.backbone.out_channels, d, kernel_size=1)
        self.encoder_1d_feature_pos_embed = nn.Embedding(1 + (1 if self.state_dim else 0) + (1 if self.env_dim else 0), d)
        self.decoder_pos_embed = nn.Embedding(cfg.chunk_size, d)
        self.action_head = nn.Linear(d, action_dim)
        for p in [*self.encoder.parameters(), *self.decoder.parameters()]:
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def forward(self, batch: dict[str, torch.Tensor], sample_latent: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(actions [B, chunk, A], mu, log-variance); the CVAE encoder runs when `sample_latent`."""
        cfg = self.cfg
        first = batch[self.image_keys[0]] if self.image_keys else batch[OBS_ENV_STATE]
        bsz, device = first.shape[0], first.device
        mu = logvar = None
        if cfg.use_vae and sample_latent:
            tokens = [self.vae_encoder_cls_embed.weight[None].expand(bsz, -1, -1)]
            if self.state_dim:
                tokens.append(self.vae_encoder_robot_state_input_proj(batch[OBS_STATE])[:, None])
            tokens.append(self.vae_encoder_action_input_proj(batch["action"]))
            x = torch.cat(tokens, dim=1)
            pad = batch.get("action_is_pad")
            if pad is None:
                pad = torch.zeros(bsz, cfg.chunk_size, dtype=torch.bool, device=device)
            head = torch.zeros(bsz, x.shape[1] - pad.shape[1], dtype=torch.bool, device=device)
            pos_enc: torch.Tensor = self.vae_encoder_pos_enc  # type: ignore[assignment]
            cls_out = self.vae_encoder(x, pos_enc.to(x.dtype), key_padding_mask=torch.cat([head, pad], dim=1), first_only=True)[:, 0]
            mu, logvar = self.vae_encoder_latent_output_proj(cls_out).split(cfg.latent_dim, dim=-1)
            latent = mu + (logvar / 2).exp() * torch.randn_like(mu)
        else:
            latent = torch.zeros(bsz, cfg.latent_dim, dtype=self.encoder_latent_input_proj.weight.dtype, device=device)
        tokens = [self.encoder_latent_input_proj(latent)]
        if self.state_dim:
            tokens.append(self.encoder_robot_state_input_proj(batch[OBS_STATE]))
        if self.env_dim:
            tokens.append(self.encoder_env_state_input_proj(batch[OBS_ENV_STATE]))
        x = torch.stack(tokens, dim=1)
        pos = self.encoder_1d_feature_pos_embed.weight[None].expand(bsz, -1, -1)
        xs, poss = [x], [pos]
        for key in self.image_keys:
            fmap = self.backbone(batch[key])
            _, _, h, w = fmap.shape
            cam_pos = sinusoid_2d(h, w, cfg.dim_model // 2, device).to(fmap.dtype)
            xs.append(self.encoder_img_feat_input_proj(fmap).flatten(2).transpose(1, 2))
            poss.append(cam_pos[None].expand(bsz, -1, -1))
        x, pos = torch.cat(xs, dim=1), torch.cat(poss, dim=1).to(x.dtype)
        memory = self.encoder(x, pos)
        queries = torch.zeros(bsz, cfg.chunk_size, cfg.dim_model, dtype=pos.dtype, device=device)
        out = self.decoder(queries, memory, self.decoder_pos_embed.weight[None].to(pos.dtype), pos)
        actions: torch.Tensor = self.action_head(out)
        return actions, mu, logvar


class ACTPolicy(Policy):
    config_class: ClassVar[type[PolicyConfigBase]] = ACTConfig
    name: ClassVar[str] = "act"
    _fsdp_wrap_modules: ClassVar[list[str]] = ["ACTEncoderLayer", "ACTDecoderLayer"]
    _peft_target_modules: ClassVar[list[str]] = ["linear1", "linear2"]

    def __init__(self, config: PolicyConfigBase) -> None:
        super().__init__(config)
        assert isinstance(config, ACTConfig)
        self.cfg = config
        self.model = ACT(config, self.action_dim)
        self._ensemble: _TemporalEnsemble | None = None
        if config.temporal_ensemble_coeff is not None:
            self._ensemble = _TemporalEnsemble(config.temporal_ensemble_coeff, config.chunk_size)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        pred, mu, logvar = self.model(batch, sample_latent=self.training)
        l1 = masked_l1(pred, batch["action"], batch.get("action_is_pad"))
        info = {"l1_loss": l1.detach()}
        loss = l1
        if mu is not None and logvar is not None:
            mu, logvar = mu.float(), logvar.float()  # the loss in float32, whatever the weights' dtype
            kld = (-0.5 * (1 + logvar - mu.pow(2) - logvar.exp())).sum(-1).mean()
            loss = l1 + self.cfg.kl_weight * kld
            info["kld_loss"] = kld.detach()
        return loss, info

    def predict_action_chunk(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model(batch, sample_latent=False)[0]

    def reset(self) -> None:
        super().reset()
        if self._ensemble is not None:
            self._ensemble.reset()

    @torch.no_grad()
    def select_action(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self._ensemble is not None:
            return self._ensemble.update(self.predict_action_chunk(batch).float())
        return super().select_action(batch)


class _TemporalEnsemble:
    """ACT's temporal ensembling (the paper's Algorithm 2): every step predicts a chunk; the
    action for a step averages every prediction made for it, the i-th oldest weighted by
    exp(-coeff * i), kept as a running weighted mean."""

    def __init__(self, coeff: float, chunk_size: int) -> None:
        self.weights = torch.exp(-coeff * torch.arange(chunk_size, dtype=torch.float32))
        self.cumulative = self.weights.cumsum(0)
        self.reset()

    def reset(self) -> None:
        self.mean: torch.Tensor | None = None
        self.count: torch.Tensor | None = None

    def update(self, chunk: torch.Tensor) -> torch.Tensor:
        w, cum = self.weights.to(chunk.device), self.cumulative.to(chunk.device)
        if self.mean is None or self.count is None:
            self.mean = chunk.clone()
            self.count = torch.ones(chunk.shape[1], 1, dtype=torch.long, device=chunk.device)
        else:
            idx = self.count - 1
            self.mean = (self.mean * cum[idx] + chunk[:, :-1] * w[self.count]) / cum[self.count]
            self.count = torch.clamp(self.count + 1, max=len(w))
            self.mean = torch.cat([self.mean, chunk[:, -1:]], dim=1)
            self.count = torch.cat([self.count, torch.ones_like(self.count[-1:])])
        action, self.mean, self.count = self.mean[:, 0], self.mean[:, 1:], self.count[1:]
        return action


__all__ = ["ACT", "ACTPolicy", "FrozenBatchNorm2d", "ResNetTrunk"]
