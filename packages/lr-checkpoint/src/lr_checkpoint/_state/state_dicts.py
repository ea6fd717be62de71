"""Model and optimizer state in one shape for every layout (plain, DDP, FSDP2, HSDP).

Everything goes through `torch.distributed.checkpoint.state_dict`, so keys are the
model's FQNs whatever wraps it (no `module.` prefix from DDP), and sharded parameters
come out as DTensors that DCP reshards on load.

The optimizer's state splits into two parts:
- tensors, flat, named `state.<param fqn>.<state name>` (`state.blocks.0.weight.exp_avg`):
  what goes into `optimizer_state.safetensors` or the `optimizer_0/` DCP folder;
- everything else (param groups with their FQN lists, non-tensor per-parameter state):
  JSON-able data for `optimizer_param_groups.json`. DCP would pickle these, and loading
  would unpickle them; JSON keeps checkpoints free of pickles.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from lr_config import CheckpointError

from .._formats.json_files import OPTIMIZER_JSON_VERSION
from .._ranks import is_distributed, is_main

__all__ = [
    "full_model_state",
    "full_optimizer_state",
    "gather_model_state_dict",
    "is_sharded",
    "join_optimizer_state",
    "load_full_model_state",
    "load_full_optimizer_state",
    "local_model_state",
    "local_optimizer_state",
    "split_optimizer_state",
]

_GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)
_BROADCAST = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)


def is_sharded(model: nn.Module) -> bool:
    """True for fully_shard-ed modules (FSDP2/HSDP): their parameters are DTensors."""
    return any(isinstance(p, DTensor) for p in model.parameters())


def _tensors_only(state: dict[str, Any], what: str) -> dict[str, torch.Tensor]:
    others = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if others:
        raise CheckpointError(f"{what} entries {others[:5]} are not tensors; checkpoints hold model tensors only")
    return state


def local_model_state(model: nn.Module, trainable_only: bool = False) -> dict[str, torch.Tensor]:
    """This rank's view of the model state (DTensor shards for sharded models), FQN keyed.

    `trainable_only` keeps parameters with requires_grad (PEFT adapters and
    full_training_modules): what an adapter checkpoint holds.
    """
    options = StateDictOptions(ignore_frozen_params=trainable_only)
    return _tensors_only(get_model_state_dict(model, options=options), "model state")


def full_model_state(model: nn.Module, trainable_only: bool = False) -> dict[str, torch.Tensor]:
    """Collective: the full CPU model state on the main rank, {} elsewhere."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only)
    state = get_model_state_dict(model, options=options)
    return _tensors_only(state, "model state") if is_main() else {}


def gather_model_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Collective: the full CPU state dict (FQN keys, master dtype) on the main rank, {} elsewhere.

    The public gather of full model weights (lr-publish uses it). Works for plain,
    DDP-wrapped and fully_shard-ed modules, with or without a process group. Every rank must
    call it. Tensors of a module that is not distributed may share memory with its live
    parameters: copy them before changing the module.
    """
    return full_model_state(model)


def local_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's optimizer state dict, FQN keyed (initializes empty state first)."""
    return get_optimizer_state_dict(model, optimizer)


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Collective: the full CPU optimizer state on the main rank, {} elsewhere."""
    state = get_optimizer_state_dict(model, optimizer, options=_GATHER)
    return state if is_main() else {}


def _check_json(value: Any, where: str) -> Any:
    try:
        json.dumps(value, allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"optimizer {where} cannot be saved as JSON ({exc}); checkpoints store param groups as JSON") from None
    return value


def split_optimizer_state(osd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """`(flat tensors, JSON part)` of an FQN-keyed optimizer state dict."""
    tensors: dict[str, torch.Tensor] = {}
    other: dict[str, dict[str, Any]] = {}
    for fqn, entries in osd["state"].items():
        for name, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{fqn}.{name}"] = value
            else:
                other.setdefault(fqn, {})[name] = _check_json(value, f"state {fqn}.{name}")
    groups = [_check_json(dict(g), f"param group {i}") for i, g in enumerate(osd["param_groups"])]
    return tensors, {"version": OPTIMIZER_JSON_VERSION, "param_groups": groups, "non_tensor_state": other}


def _like_template(value: Any, template: Any) -> Any:
    """JSON turns tuples (Adam's betas) into lists; give them back their type."""
    if isinstance(template, tuple) and isinstance(value, list):
        return tuple(value)
    return value


def _groups_like(groups: list[dict[str, Any]], template: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {key: _like_template(value, tmpl.get(key)) for key, value in group.items()}
        for group, tmpl in zip(groups, template)
    ]


def join_optimizer_state(tensors: dict[str, torch.Tensor], extra: dict[str, Any], template_groups: list[dict[str, Any]]) -> dict[str, Any]:
    """Inverse of `split_optimizer_state` (optimizer state names hold no dots)."""
    state: dict[str, dict[str, Any]] = {}
    for key, value in tensors.items():
        fqn, _, name = key.removeprefix("state.").rpartition(".")
        state.setdefault(fqn, {})[name] = value
    for fqn, entries in extra["non_tensor_state"].items():
        state.setdefault(fqn, {}).update(entries)
    return {"state": state, "param_groups": _groups_like(extra["param_groups"], template_groups)}


def load_full_model_state(model: nn.Module, state: dict[str, torch.Tensor], strict: bool = True) -> None:
    """Collective: load a full state (read on the main rank only) into any layout.

    `strict=False` for adapter checkpoints, which hold only the trainable tensors.
    """
    if is_distributed():
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=strict)
        set_model_state_dict(model, dict(state) if is_main() else {}, options=options)
    else:
        set_model_state_dict(model, dict(state), options=StateDictOptions(strict=strict))


def load_full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, osd: dict[str, Any]) -> None:
    """Collective: load a full optimizer state (main rank only) into any layout."""
    if is_distributed():
        set_optimizer_state_dict(model, optimizer, osd if is_main() else {}, options=_BROADCAST)
    else:
        set_optimizer_state_dict(model, optimizer, osd)
