"""The accelerate environment guard.

`accelerate` reconfigures training through environment variables. Those that would
change the layout, the accumulation or the precision behind the config are refused,
because a layout that silently becomes another one is what lr exists to prevent:

- `ACCELERATE_USE_FSDP`, `ACCELERATE_USE_PARALLELISM_CONFIG`,
  `ACCELERATE_GRADIENT_ACCUMULATION_STEPS`, any `FSDP_*` or `PARALLELISM_CONFIG_*`;
- `ACCELERATE_MIXED_PRECISION` when it differs from `--accelerator.mixed_precision`
  (`accelerate launch` always exports it, `no` by default, so an agreeing value passes).

Plain `accelerate launch` (which exports `ACCELERATE_DYNAMO_*` and similar) passes.

`LR_ALLOW_ACCELERATE_ENV=1` (or LeRobot's `LEROBOT_ALLOW_ACCELERATE_ENV=1`) acknowledges them, and
then they apply, as in LeRobot: `apply_accelerate_env` maps each onto the flag it means
(`ACCELERATE_MIXED_PRECISION=bf16` -> `--accelerator.mixed_precision=bf16`, `ACCELERATE_USE_FSDP=true`
-> `--parallelism.dp_shard=-1`, `FSDP_TRANSFORMER_CLS_TO_WRAP` -> `--accelerator.fsdp.wrap_modules`,
...), returns the config with them and one line per mapping, so `train_config.json` still describes
the run. A variable lr cannot map (one for FSDP1 or a feature lr does not have) is named and
refused even then, and so is one that contradicts a flag given with another value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ._configs import TrainConfig
from ._errors import ConfigError

__all__ = ["ALLOW_ENV", "ALLOW_ENVS", "apply_accelerate_env", "check_accelerate_env", "refused_accelerate_vars"]

ALLOW_ENV = "LR_ALLOW_ACCELERATE_ENV"
ALLOW_ENVS = (ALLOW_ENV, "LEROBOT_ALLOW_ACCELERATE_ENV")

_EXACT = {
    "ACCELERATE_USE_FSDP": "--parallelism.dp_shard=-1 (FSDP2 over every process)",
    "ACCELERATE_USE_PARALLELISM_CONFIG": "--parallelism.dp_replicate and --parallelism.dp_shard",
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "--accelerator.gradient_accumulation.steps",
    "FSDP_SHARDING_STRATEGY": "--parallelism.dp_shard (FSDP2), with --parallelism.dp_replicate for HSDP",
    "FSDP_TRANSFORMER_CLS_TO_WRAP": "--accelerator.fsdp.wrap_modules",
    "FSDP_AUTO_WRAP_POLICY": "--accelerator.fsdp.wrap_modules or --accelerator.fsdp.min_num_params",
    "FSDP_MIN_NUM_PARAMS": "--accelerator.fsdp.min_num_params",
    "FSDP_OFFLOAD_PARAMS": "--accelerator.fsdp.cpu_offload",
    "FSDP_RESHARD_AFTER_FORWARD": "--accelerator.fsdp.reshard_after_forward",
    "FSDP_VERSION": "--parallelism.dp_shard (lr shards with FSDP2 only)",
    "PARALLELISM_CONFIG_DP_SHARD_SIZE": "--parallelism.dp_shard",
    "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "--parallelism.dp_replicate",
}
_PREFIXES = {
    "FSDP_": "no lr setting (unset it)",
    "PARALLELISM_CONFIG_": "no lr setting (unset it; lr has data parallelism only)",
}
_PRECISION = "ACCELERATE_MIXED_PRECISION"


def refused_accelerate_vars(env: Mapping[str, str], mixed_precision: str) -> dict[str, str]:
    """Variable -> what to use instead (an existing lr flag, or "no lr setting"), for every
    variable the guard refuses."""
    refused: dict[str, str] = {}
    for name in sorted(env):
        if name in _EXACT:
            refused[name] = _EXACT[name]
        elif name == _PRECISION and env[name].strip().lower() not in ("", mixed_precision):
            refused[name] = f"--accelerator.mixed_precision={env[name].strip().lower()} (it is {mixed_precision})"
        else:
            for prefix, hint in _PREFIXES.items():
                if name.startswith(prefix):
                    refused[name] = hint
    return refused


def acknowledged(env: Mapping[str, str]) -> bool:
    return any(env.get(name) == "1" for name in ALLOW_ENVS)


def check_accelerate_env(env: Mapping[str, str], mixed_precision: str) -> list[str]:
    """Raise ConfigError naming each refused variable; return them when acknowledged."""
    refused = refused_accelerate_vars(env, mixed_precision)
    if not refused:
        return []
    if acknowledged(env):
        return list(refused)
    lines = [f"{name}={env[name]!r}: " + (hint if hint.startswith("no ") else f"use {hint} instead") for name, hint in refused.items()]
    raise ConfigError(
        "accelerate environment variables would reconfigure the engine behind the config:\n  "
        + "\n  ".join(lines)
        + f"\nUnset them (lr reads its settings from flags), or set {ALLOW_ENV}=1 (or LEROBOT_ALLOW_ACCELERATE_ENV=1) "
        "to apply them as the flags they mean.",
        problems=lines,
    )


class _Unmappable(Exception):
    """A variable lr has no setting for (its message says what to do instead)."""


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def _bool(value: str) -> bool:
    text = value.strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise _Unmappable(f"expected true or false, got {value!r}")


def _int(value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise _Unmappable(f"expected an integer, got {value!r}") from None


def _fsdp_on(value: str) -> dict[str, Any]:
    return {"parallelism.dp_shard": -1} if _bool(value) else {}


def _strategy(value: str) -> dict[str, Any]:
    name = value.strip().upper()
    name = {"1": "FULL_SHARD", "2": "SHARD_GRAD_OP", "3": "NO_SHARD", "4": "HYBRID_SHARD"}.get(name, name)
    if name == "FULL_SHARD":
        return {"parallelism.dp_shard": -1}
    if name == "SHARD_GRAD_OP":
        return {"parallelism.dp_shard": -1, "accelerator.fsdp.reshard_after_forward": False}
    if name == "NO_SHARD":
        raise _Unmappable("a run that does not shard is DDP in lr: give no --parallelism.* flags")
    if name == "HYBRID_SHARD":
        raise _Unmappable("HSDP needs its degrees: --parallelism.dp_replicate=R --parallelism.dp_shard=S")
    raise _Unmappable(f"unknown sharding strategy {value!r}")


def _wrap_policy(value: str) -> dict[str, Any]:
    name = value.strip().upper()
    if name in ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP"):
        return {}  # the units come from FSDP_TRANSFORMER_CLS_TO_WRAP / FSDP_MIN_NUM_PARAMS, else the policy's own
    raise _Unmappable("lr never wraps the root alone: use --accelerator.fsdp.wrap_modules or --accelerator.fsdp.min_num_params")


def _version(value: str) -> dict[str, Any]:
    if value.strip() == "2":
        return {}  # lr's sharding is FSDP2
    raise _Unmappable("lr shards with FSDP2 only (fully_shard); FSDP1 has no equivalent here")


def _nothing(_checked: object) -> dict[str, Any]:
    """A variable whose meaning the others carry (its value only checked)."""
    return {}


def _flag_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _degree(flag: str) -> Any:
    return lambda value: {flag: _int(value)}


def _size_one(what: str) -> Any:
    def check(value: str) -> dict[str, Any]:
        if _int(value) != 1:
            raise _Unmappable(f"{what} is not supported by lr (its degree must be 1)")
        return {}

    return check


_MAPPINGS: dict[str, Any] = {
    "ACCELERATE_MIXED_PRECISION": lambda value: {"accelerator.mixed_precision": value.strip().lower()},
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": lambda value: {"accelerator.gradient_accumulation.steps": _int(value)},
    "ACCELERATE_USE_FSDP": _fsdp_on,
    "ACCELERATE_USE_PARALLELISM_CONFIG": lambda value: _nothing(_bool(value)),
    "FSDP_VERSION": _version,
    "FSDP_SHARDING_STRATEGY": _strategy,
    "FSDP_AUTO_WRAP_POLICY": _wrap_policy,
    "FSDP_TRANSFORMER_CLS_TO_WRAP": lambda value: {"accelerator.fsdp.wrap_modules": [c.strip() for c in value.split(",") if c.strip()]},
    "FSDP_MIN_NUM_PARAMS": lambda value: {"accelerator.fsdp.min_num_params": _int(value)},
    "FSDP_OFFLOAD_PARAMS": lambda value: {"accelerator.fsdp.cpu_offload": _bool(value)},
    "FSDP_RESHARD_AFTER_FORWARD": lambda value: {"accelerator.fsdp.reshard_after_forward": _bool(value)},
    "PARALLELISM_CONFIG_DP_SHARD_SIZE": _degree("parallelism.dp_shard"),
    "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": _degree("parallelism.dp_replicate"),
    "PARALLELISM_CONFIG_TP_SIZE": _size_one("tensor parallelism"),
    "PARALLELISM_CONFIG_CP_SIZE": _size_one("context parallelism"),
}


def _get(data: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        data = data[part]
    return data


def _set(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        data = data[part]
    data[last] = value


def apply_accelerate_env(cfg: TrainConfig, env: Mapping[str, str]) -> tuple[TrainConfig, list[str]]:
    """`cfg` with accelerate's variables applied as the flags they mean, and one line per mapping
    (see the module docstring); ConfigError for unacknowledged, unmappable or conflicting ones."""
    from ._serde import from_dict, to_dict

    refused = refused_accelerate_vars(env, cfg.accelerator.mixed_precision)
    if not refused:
        return cfg, []
    check_accelerate_env(env, cfg.accelerator.mixed_precision)  # raises unless acknowledged
    data, defaults = to_dict(cfg), to_dict(TrainConfig())
    lines: list[str] = []
    problems: list[str] = []
    for name in refused:
        try:
            mapped = _MAPPINGS[name](env[name]) if name in _MAPPINGS else None
        except _Unmappable as exc:
            problems.append(f"{name}={env[name]!r}: {exc}")
            continue
        if mapped is None:
            problems.append(f"{name}={env[name]!r}: lr has no setting for it; unset it")
            continue
        for path, value in mapped.items():
            current = _get(data, path)
            if current not in (value, _get(defaults, path)):
                problems.append(f"{name}={env[name]!r} means --{path}={_flag_value(value)}, but --{path} is {_flag_value(current)}")
                continue
            _set(data, path, value)
        shown = " ".join(f"--{path}={_flag_value(value)}" for path, value in mapped.items()) or "nothing to change"
        lines.append(f"{name}={env[name]} -> {shown}")
    if problems:
        raise ConfigError(
            "accelerate environment variables that lr cannot apply (even with the override):\n  " + "\n  ".join(problems)
            + "\nUnset them, or give the lr flags instead.",
            problems=problems,
        )
    return from_dict(TrainConfig, data, source="the accelerate environment"), lines
