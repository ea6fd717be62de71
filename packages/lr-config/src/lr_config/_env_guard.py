"""The accelerate environment guard.

`accelerate` reconfigures training through environment variables. Those that would
change the layout, the accumulation or the precision behind the config are refused,
because a layout that silently becomes another one is what lr exists to prevent:

- `ACCELERATE_USE_FSDP`, `ACCELERATE_USE_PARALLELISM_CONFIG`,
  `ACCELERATE_GRADIENT_ACCUMULATION_STEPS`, any `FSDP_*` or `PARALLELISM_CONFIG_*`;
- `ACCELERATE_MIXED_PRECISION` when it differs from `--accelerator.mixed_precision`
  (`accelerate launch` always exports it, `no` by default, so an agreeing value passes).

Plain `accelerate launch` (which exports `ACCELERATE_DYNAMO_*` and similar) passes.
`LR_ALLOW_ACCELERATE_ENV=1` acknowledges the variables and continues; they are then
ignored, since lr never reads them.
"""

from __future__ import annotations

from collections.abc import Mapping

from ._errors import ConfigError

__all__ = ["ALLOW_ENV", "check_accelerate_env", "refused_accelerate_vars"]

ALLOW_ENV = "LR_ALLOW_ACCELERATE_ENV"

_EXACT = {
    "ACCELERATE_USE_FSDP": "--parallelism.dp_shard (FSDP2) and --accelerator.fsdp.*",
    "ACCELERATE_USE_PARALLELISM_CONFIG": "--parallelism.dp_replicate / --parallelism.dp_shard",
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "--accelerator.gradient_accumulation.steps",
}
_PREFIXES = {
    "FSDP_": "--accelerator.fsdp.*",
    "PARALLELISM_CONFIG_": "--parallelism.*",
}
_PRECISION = "ACCELERATE_MIXED_PRECISION"


def refused_accelerate_vars(env: Mapping[str, str], mixed_precision: str) -> dict[str, str]:
    """Variable -> the lr flag to use instead, for every variable the guard refuses."""
    refused: dict[str, str] = {}
    for name in sorted(env):
        if name in _EXACT:
            refused[name] = _EXACT[name]
        elif name == _PRECISION and env[name].strip().lower() not in ("", mixed_precision):
            refused[name] = f"--accelerator.mixed_precision={env[name].strip().lower()} (it is {mixed_precision})"
        else:
            for prefix, flag in _PREFIXES.items():
                if name.startswith(prefix):
                    refused[name] = flag
    return refused


def check_accelerate_env(env: Mapping[str, str], mixed_precision: str) -> list[str]:
    """Raise ConfigError naming each refused variable; return them when acknowledged."""
    refused = refused_accelerate_vars(env, mixed_precision)
    if not refused:
        return []
    if env.get(ALLOW_ENV) == "1":
        return list(refused)
    lines = [f"{name}={env[name]!r}: use {flag} instead" for name, flag in refused.items()]
    raise ConfigError(
        "accelerate environment variables would reconfigure the engine behind the config:\n  "
        + "\n  ".join(lines)
        + f"\nUnset them (lr reads its settings from flags only), or set {ALLOW_ENV}=1 to ignore them and continue.",
        problems=lines,
    )
