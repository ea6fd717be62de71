"""A saved policy's `config.json`: the policy settings beside its `model.safetensors`.

`{"version": POLICY_CONFIG_VERSION, "type": "act", ...every field of the policy config}`.
`--policy.path=<folder>` starts from it: the parser takes the policy block from this file
(keeping where the run puts and publishes the policy), then merges the other `--policy.*`
flags over it, as lerobot-train does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._configs import PolicyConfig, PolicyConfigBase
from ._errors import ConfigError
from ._serde import from_dict, read_json_object, to_dict
from .layout import MODEL_WEIGHTS, POLICY_CONFIG

__all__ = ["POLICY_CONFIG_VERSION", "load_policy_config", "policy_config_dict"]

POLICY_CONFIG_VERSION = 1


def policy_config_dict(config: PolicyConfigBase) -> dict[str, Any]:
    """What `config.json` holds for `config`."""
    return {"version": POLICY_CONFIG_VERSION, "type": config.type_name, **to_dict(config)}


def load_policy_config(directory: Path) -> PolicyConfigBase:
    """The policy config saved in `directory/config.json`; errors name --policy.path."""
    directory = Path(directory)
    path = directory / POLICY_CONFIG
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"--policy.path: {directory} is a file; point it at a folder with {POLICY_CONFIG} and {MODEL_WEIGHTS}")
    data = read_json_object(
        path, prefix="--policy.path: ", missing=f" is missing; point it at a folder with {POLICY_CONFIG} and {MODEL_WEIGHTS}"
    )
    if data.pop("version", None) != POLICY_CONFIG_VERSION:
        raise ConfigError(f"--policy.path: {path} has an unsupported version; expected {POLICY_CONFIG_VERSION}")
    config: PolicyConfigBase = from_dict(PolicyConfig, data, source=str(path))  # type: ignore[arg-type]
    return config
