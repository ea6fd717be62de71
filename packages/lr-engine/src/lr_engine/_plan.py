"""`lr-engine train --dry_run=true [--world_size=N]`: validate, resolve, plan, print; train nothing.

The policy is built on the meta device (no memory, no weights read), the topology is
resolved for N processes, and the FSDP units are chosen exactly as a real run would
choose them, so every start-up error a run would hit on layout shows here, exit 2; so does
a `--policy.device` this machine lacks. The
memory estimate is per rank, fp32 master weights: parameters and gradients (sharded
1/dp_shard per parameter, rounded up as FSDP2 pads dim 0; ignored modules whole) and the
optimizer's state (AdamW/Adam: 2 tensors per trainable parameter; SGD: 1).
"""

from __future__ import annotations

import os
from dataclasses import replace

import torch
from lr_config import ConfigError, DEMO_REPO_ID, TrainConfig, banner_line, demo_preset_note, lerobot_optimizer_note, validate
from torch import nn

from ._data.dataset import demo_meta_without_files, load_meta
from ._data.locate import meta_root
from ._parallel.dist import requested_device
from ._parallel.wrap import WrapPlan, plan_wrap
from ._policies.registry import make_policy
from ._setup import policy_type


def _meta_policy(cfg: TrainConfig) -> tuple[TrainConfig, nn.Module]:
    policy_cfg = cfg.policy  # with --policy.path, the parser started it from that folder's config.json
    if policy_cfg.input_features is None or policy_cfg.output_features is None:
        root = meta_root(cfg.dataset)
        if cfg.dataset.root is None and cfg.dataset.repo_id == DEMO_REPO_ID and not (root / "meta" / "info.json").exists():
            meta = demo_meta_without_files(cfg.dataset.repo_id)
        else:
            meta = load_meta(root)
        inputs, outputs = meta.policy_features()
        policy_cfg = replace(policy_cfg, input_features=inputs, output_features=outputs)
    cfg = replace(cfg, policy=policy_cfg)
    with torch.device("meta"):
        policy: nn.Module = make_policy(policy_cfg)
        if cfg.peft.method_type is not None:
            from ._adapters import apply_lora

            policy = apply_lora(policy, cfg)
    return cfg, policy


def _local_numel(p: torch.Tensor, shards: int) -> int:
    if p.dim() == 0 or shards == 1:
        return p.numel()
    rows = -(-p.shape[0] // shards)
    return rows * (p.numel() // max(1, p.shape[0]))


def _per_rank_numel(model: nn.Module, plan: WrapPlan | None, shards: int, trainable_only: bool) -> int:
    ignored = set()
    if plan is not None:
        modules = dict(model.named_modules())
        ignored = {id(p) for name in plan.ignored for p in modules[name].parameters()}
    total = 0
    for p in model.parameters():
        if trainable_only and not p.requires_grad:
            continue
        total += p.numel() if id(p) in ignored else _local_numel(p, shards)
    return total


def _mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def plan_lines(cfg: TrainConfig, world_size: int) -> list[str]:
    topo = validate(cfg, world_size=world_size)
    assert topo is not None
    cfg, policy = _meta_policy(cfg)
    total = sum(p.numel() for p in policy.parameters())
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    lines = [
        f"lr-engine dry run: {world_size} process{'es' if world_size > 1 else ''}, nothing will be trained",
        banner_line(cfg, topo),
        f"policy {cfg.policy.type_name}: {total:,} parameters ({trainable:,} trainable)",
    ]
    plan: WrapPlan | None = None
    if topo.sharded:
        plan = plan_wrap(policy, cfg, policy_type(policy)._fsdp_wrap_modules)
        lines.append(f"FSDP units ({plan.source}): {len(plan.units)}, then the root")
        in_units = 0
        for fqn, unit in plan.units:
            n = sum(p.numel() for p in unit.parameters())
            in_units += n
            lines.append(f"  {fqn}  {type(unit).__name__}  {n:,} params")
        lines.append(f"  (root)  {type(policy).__name__}  {total - in_units:,} params outside units")
        for name in plan.ignored:
            lines.append(f"  ignored (unsharded): {name}")
    else:
        lines.append(f"FSDP units: none ({topo.layout} does not shard)")
    shards = topo.dp_shard
    params = _per_rank_numel(policy, plan, shards, trainable_only=False) * 4
    grads = _per_rank_numel(policy, plan, shards, trainable_only=True) * 4
    states = 1 if cfg.optimizer.type == "sgd" else 2
    optim = grads * states
    if (optimizer := lerobot_optimizer_note(cfg)) is not None:
        lines.append(optimizer)
    lines.append(
        f"per-rank memory estimate (fp32 master weights, {cfg.optimizer.type}): parameters {_mb(params)}, "
        f"gradients {_mb(grads)}, optimizer {_mb(optim)}, total {_mb(params + grads + optim)}"
    )
    if (note := demo_preset_note(cfg.policy)) is not None:
        lines.append(f"policy: {note}")
    return lines


def dry_run(cfg: TrainConfig) -> int:
    world = cfg.world_size or int(os.environ.get("WORLD_SIZE", "1"))
    if world < 1:
        raise ConfigError(f"--world_size: must be >= 1, got {world}")
    if cfg.policy.device:  # as the run would: a device this machine lacks is refused here too
        requested_device(cfg.policy.device, 0)
    print("\n".join(plan_lines(cfg, world)), flush=True)
    return 0
