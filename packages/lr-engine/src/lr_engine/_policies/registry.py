"""The registry of policies (`act`, `mlp`) and safetensors-only save/load.

`save_pretrained(policy, dir)` writes `config.json` (the policy config, tagged by `type`,
with `version`) and `model.safetensors`; it is collective under a process group: every rank
of any layout calls it (a plain, DDP-wrapped or FSDP2-sharded policy), the full state is
gathered once, and the main rank writes. `load_pretrained(dir)` reads them back. Weights
travel only as safetensors: nothing is unpickled.
"""

from __future__ import annotations

from pathlib import Path

import torch
from lr_checkpoint import write_tensor_dict
from lr_config import ConfigError, PolicyConfigBase, load_policy_config, policy_config_dict, save_json
from lr_config.layout import MODEL_DCP, MODEL_WEIGHTS, POLICY_CONFIG
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from .act import ACTPolicy
from .base import Policy
from .mlp import MLPPolicy


def registry() -> dict[str, type[Policy]]:
    return {"act": ACTPolicy, "mlp": MLPPolicy}


def policy_class(type_name: str) -> type[Policy]:
    classes = registry()
    if type_name not in classes:
        raise ConfigError(f"--policy.type: unknown policy type {type_name!r}; known: {', '.join(classes)}")
    return classes[type_name]


def make_policy(config: PolicyConfigBase) -> Policy:
    return policy_class(config.type_name)(config)


def save_pretrained(policy: nn.Module, directory: Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """config.json + model.safetensors, on every rank (see the module docstring): the state is
    gathered here unless `state_dict` (the main rank's full one, gathered before) is given."""
    import torch.distributed as dist
    from lr_checkpoint import gather_model_state_dict

    inner = policy.module if isinstance(policy, nn.parallel.DistributedDataParallel) else policy
    assert isinstance(inner, Policy), f"save_pretrained takes a policy, got {type(inner).__name__}"
    state = state_dict if state_dict is not None else gather_model_state_dict(policy)
    distributed = dist.is_available() and dist.is_initialized()
    if not distributed or dist.get_rank() == 0:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_json(directory / POLICY_CONFIG, policy_config_dict(inner.config))
        write_tensor_dict(directory / MODEL_WEIGHTS, state)
    if distributed:
        dist.barrier()


def load_weights(policy: nn.Module, directory: Path) -> None:
    path = Path(directory) / MODEL_WEIGHTS
    if not path.exists():
        dcp = Path(directory) / MODEL_DCP
        hint = f"; it has only DCP shards: run lr-checkpoint convert {directory}" if dcp.exists() else ""
        raise ConfigError(f"--policy.path: {path} is missing{hint}")
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise ConfigError(f"--policy.path: {path} is not a readable safetensors file ({exc})") from None
    try:
        missing, unexpected = policy.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # a tensor of another shape: an architecture setting differs from the saved one
        sizes = [line.strip() for line in str(exc).splitlines() if "size mismatch" in line][:3]
        raise ConfigError(
            f"--policy.path: {path} does not fit the policy these settings build ({'; '.join(sizes) or exc}); "
            f"architecture settings (sizes, layers, heads) cannot change when fine-tuning: keep those of {Path(directory) / POLICY_CONFIG}"
        ) from None
    if missing or unexpected:
        raise ConfigError(
            f"--policy.path: {path} does not match the policy in config.json "
            f"(missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]})"
        )


def load_pretrained(directory: Path) -> Policy:
    policy = make_policy(load_policy_config(directory))
    load_weights(policy, directory)
    return policy
