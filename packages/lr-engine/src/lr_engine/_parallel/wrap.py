"""Wrapping a policy for its layout: nothing, DDP, or FSDP2 (HSDP on a 2-D mesh).

The order, written once:
1. choose the wrap units (precedence: `--accelerator.fsdp.wrap_modules`, then
   `--accelerator.fsdp.min_num_params`, then the policy's `_fsdp_wrap_modules`); no unit
   at all is a start-up error, never a silent root-only wrap;
2. refuse parameters tied across a unit boundary, naming them (FSDP2 would shard one side
   and leave the other pointing at a stale tensor);
3. `fully_shard` each unit, then the root, with the mixed-precision and offload policies;
   modules matching `--accelerator.fsdp.ignored_modules` stay unsharded and their
   gradients are all-reduced by `sync_ignored_grads`;
4. register `_fsdp_forward_methods` so `select_action` works on the sharded policy.
DDP is the replicate-only layout (`dp_shard == 1`): `DistributedDataParallel` with the
`--accelerator.ddp.*` settings. The same calls run on gloo and NCCL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch.distributed as dist
from lr_config import ConfigError, FSDPConfig, TrainConfig
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard, register_fsdp_forward_method

from .dist import DistContext
from .precision import fsdp_mixed_precision


@dataclass
class WrapPlan:
    units: list[tuple[str, nn.Module]]
    source: str
    ignored: list[str]


def _by_class_names(model: nn.Module, names: list[str], flag: str) -> list[tuple[str, nn.Module]]:
    present = sorted({type(m).__name__ for m in model.modules()})
    unknown = [n for n in names if n not in present]
    if unknown:
        raise ConfigError(
            f"{flag}: no module of class {', '.join(map(repr, unknown))} in {type(model).__name__}; "
            f"its module classes are: {', '.join(present)}"
        )
    return [(fqn, m) for fqn, m in model.named_modules() if fqn and type(m).__name__ in names]


def _by_size(model: nn.Module, min_params: int) -> list[tuple[str, nn.Module]]:
    """Post-order: wrap a module once the parameters not yet in a unit reach `min_params`."""
    units: list[tuple[str, nn.Module]] = []

    def visit(fqn: str, module: nn.Module) -> int:
        remaining = sum(p.numel() for p in module.parameters(recurse=False))
        for name, child in module.named_children():
            remaining += visit(f"{fqn}.{name}" if fqn else name, child)
        if fqn and remaining >= min_params:
            units.append((fqn, module))
            return 0
        return remaining

    visit("", model)
    return units


def choose_units(model: nn.Module, fsdp: FSDPConfig, policy_units: list[str]) -> tuple[list[tuple[str, nn.Module]], str]:
    if fsdp.wrap_modules is not None:
        return _by_class_names(model, fsdp.wrap_modules, "--accelerator.fsdp.wrap_modules"), "--accelerator.fsdp.wrap_modules"
    if fsdp.min_num_params is not None:
        return _by_size(model, fsdp.min_num_params), f"--accelerator.fsdp.min_num_params={fsdp.min_num_params}"
    if policy_units:
        return _by_class_names(model, policy_units, "the policy's _fsdp_wrap_modules"), "the policy's _fsdp_wrap_modules"
    return [], "nothing"


def largest_submodule(model: nn.Module) -> tuple[str, int]:
    """(path, parameter count) of the model's largest submodule (not the root)."""
    sizes = [(sum(p.numel() for p in m.parameters()), fqn) for fqn, m in model.named_modules() if fqn]
    size, name = max(sizes, default=(0, "(none)"))
    return name, size


def check_tied_parameters(model: nn.Module, units: list[tuple[str, nn.Module]]) -> None:
    """Raise naming parameters that are shared across a unit boundary."""
    prefixes = sorted((fqn for fqn, _ in units), key=len, reverse=True)

    def owner(name: str) -> str:
        return next((u for u in prefixes if name.startswith(u + ".")), "<root>")

    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    tied = [group for group in names.values() if len({owner(n) for n in group}) > 1]
    if tied:
        listed = "; ".join(" = ".join(group) for group in tied)
        raise ConfigError(
            f"parameters are tied across FSDP wrap units, which FSDP2 cannot shard consistently: {listed}. "
            "Untie them in the policy, or choose units that contain both sides with --accelerator.fsdp.wrap_modules"
        )


def plan_wrap(model: nn.Module, cfg: TrainConfig, policy_units: list[str]) -> WrapPlan:
    units, source = choose_units(model, cfg.accelerator.fsdp, policy_units)
    threshold = cfg.accelerator.fsdp.min_num_params
    if not units and threshold is not None and cfg.accelerator.fsdp.wrap_modules is None:
        name, size = largest_submodule(model)
        raise ConfigError(
            f"--accelerator.fsdp.min_num_params={threshold}: no submodule of {type(model).__name__} has that many parameters "
            f"(the largest, {name}, has {size:,}); lower it to at most {size:,}, or name the unit classes with "
            "--accelerator.fsdp.wrap_modules"
        )
    if not units:
        raise ConfigError(
            f"no FSDP wrap units for {type(model).__name__}: sharding would wrap only the root. Set "
            "--accelerator.fsdp.wrap_modules='[\"ClassName\"]', or --accelerator.fsdp.min_num_params=N, "
            "or declare _fsdp_wrap_modules on the policy class"
        )
    check_tied_parameters(model, units)
    ignored = ignored_module_names(model, cfg.accelerator.fsdp.ignored_modules)
    return WrapPlan(units=[(f, m) for f, m in units if not any(f == i or f.startswith(i + ".") for i in ignored)], source=source, ignored=ignored)


def ignored_module_names(model: nn.Module, pattern: str | None) -> list[str]:
    if pattern is None:
        return []
    regex = re.compile(pattern)
    names = [fqn for fqn, _ in model.named_modules() if fqn and regex.fullmatch(fqn)]
    if not names:
        raise ConfigError(f"--accelerator.fsdp.ignored_modules: {pattern!r} matches no module path (match is on the full path; start patterns with .*)")
    # keep outermost matches only
    return [n for n in names if not any(n.startswith(o + ".") for o in names if o != n)]


def _ignored_params(model: nn.Module, ignored: list[str]) -> list[nn.Parameter]:
    """Parameters of the ignored modules, in the model's (rank-independent) order."""
    modules = dict(model.named_modules())
    return [p for name in ignored for p in modules[name].parameters()]


def apply_fsdp(model: nn.Module, cfg: TrainConfig, ctx: DistContext, plan: WrapPlan) -> nn.Module:
    assert ctx.mesh is not None
    topo = ctx.topology
    mesh = ctx.mesh if topo.dp_replicate > 1 else ctx.mesh["dp_shard"]
    fsdp = cfg.accelerator.fsdp
    mp: MixedPrecisionPolicy = fsdp_mixed_precision(cfg) or MixedPrecisionPolicy()
    offload: OffloadPolicy = CPUOffloadPolicy(pin_memory=ctx.device.type == "cuda") if fsdp.cpu_offload else OffloadPolicy()
    ignored = set(_ignored_params(model, plan.ignored))
    common = dict(mesh=mesh, mp_policy=mp, offload_policy=offload)
    for _, unit in plan.units:
        fully_shard(unit, reshard_after_forward=fsdp.reshard_after_forward, **common)  # type: ignore[arg-type]
    fully_shard(model, reshard_after_forward=fsdp.reshard_after_forward, ignored_params=ignored or None, **common)  # type: ignore[arg-type]
    for method in getattr(model, "_fsdp_forward_methods", []):
        if hasattr(model, method):
            register_fsdp_forward_method(model, method)
    return model


def apply_ddp(model: nn.Module, cfg: TrainConfig, ctx: DistContext) -> nn.Module:
    ddp = cfg.accelerator.ddp
    return nn.parallel.DistributedDataParallel(
        model,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        find_unused_parameters=ddp.find_unused_parameters,
        gradient_as_bucket_view=ddp.gradient_as_bucket_view,
        static_graph=ddp.static_graph,
    )


def sync_ignored_grads(model: nn.Module, plan: WrapPlan | None, world_size: int) -> None:
    """Mean-reduce gradients of FSDP-ignored parameters across all dp ranks (gloo has no AVG)."""
    if plan is None or not plan.ignored or world_size == 1:
        return
    grads = [p.grad for p in _ignored_params(model, plan.ignored) if p.grad is not None]
    for g in grads:
        dist.all_reduce(g, op=dist.ReduceOp.SUM)
        g.div_(world_size)
