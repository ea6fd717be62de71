"""The registry of policies (`act`, `mlp` and the plugins of `lr.policies`) and safetensors-only save/load.

`save_pretrained(policy, dir)` writes `config.json` (the policy config, tagged by `type`,
with `version`) and `model.safetensors`; it is collective under a process group: every rank
of any layout calls it (a plain, DDP-wrapped or FSDP2-sharded policy), the full state is
gathered once, and the main rank writes. `load_pretrained(dir)` reads them back. Weights
travel only as safetensors: nothing is unpickled.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch
from lr_checkpoint import write_tensor_dict
from lr_config import ConfigError, PolicyConfigBase, load_policy_config, plugin_policy_class_path, save_policy_config, policy_config_dict, policy_types, save_json
from lr_config.layout import MODEL_DCP, MODEL_WEIGHTS, POLICY_CONFIG
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from .act import ACTPolicy
from .base import Policy
from .mlp import MLPPolicy


def registry() -> dict[str, type[Policy]]:
    """Every policy class by type: the built-ins and each installed plugin's (`lr.policies`)."""
    classes: dict[str, type[Policy]] = {"act": ACTPolicy, "mlp": MLPPolicy}
    for name, config_class in policy_types().items():
        if name not in classes:
            classes[name] = plugin_policy(config_class)
    return classes


def policy_class(type_name: str) -> type[Policy]:
    classes = registry()
    if type_name not in classes:
        raise ConfigError(f"--policy.type: unknown policy type {type_name!r}; known: {', '.join(classes)}")
    return classes[type_name]


_DECLARATIONS = ("_fsdp_wrap_modules", "_fsdp_forward_methods")
"""What a plugin's policy class must declare itself: the base class's defaults (no FSDP unit,
the base's entry points) would shard a large model as one unit without a word."""


def plugin_policy(config_class: type[PolicyConfigBase]) -> type[Policy]:
    """The policy class a plugin's config names (`policy_class = "module:Class"`), checked:
    a Policy subclass built from that config, declaring its FSDP units and entry points."""
    path = plugin_policy_class_path(config_class)
    assert path is not None, config_class
    where = f"policy plugin {config_class.type_name!r}: policy_class {path!r}"
    module_name, _, attr = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # the plugin's own import, whatever it raises
        raise ConfigError(f"{where} cannot be imported ({type(exc).__name__}: {exc})") from None
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise ConfigError(f"{where} must be a subclass of lr_engine.Policy, got {cls!r}")
    if getattr(cls, "config_class", None) is not config_class:
        raise ConfigError(f"{where}: {cls.__name__}.config_class must be {config_class.__name__}, the config its entry point names")
    own = {name for klass in cls.__mro__[: cls.__mro__.index(Policy)] for name in vars(klass)}
    missing = [name for name in _DECLARATIONS if name not in own]
    if missing:
        raise ConfigError(
            f"{where} does not declare {' and '.join(missing)}: list the class names of its repeated blocks "
            "(the FSDP units, [] for none) and the methods besides forward that run on a sharded model"
        )
    for name in _DECLARATIONS:
        value = getattr(cls, name)
        if not (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)):
            raise ConfigError(f"{where}: {name} must be a list of names, got {value!r}")
    return cls


def make_policy(config: PolicyConfigBase) -> Policy:
    """The policy `config` describes, fresh, in its --policy.dtype."""
    policy = policy_class(config.type_name)(config)
    if policy.param_dtype != torch.float32:
        policy.to(policy.param_dtype)
    return policy


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
        save_policy_config(directory, inner.config)
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
