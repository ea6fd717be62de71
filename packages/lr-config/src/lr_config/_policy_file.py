"""A saved policy's `config.json`, in LeRobot's layout, and lr's version of it beside it.

- `config.json` is what LeRobot 0.6.1's `PreTrainedConfig.from_pretrained` reads: `type`, then
  LeRobot's common policy fields (`n_obs_steps`, `input_features`, `output_features`, `device`,
  `use_amp`, `use_peft`, `push_to_hub`, `repo_id`, `private`, `tags`, `license`,
  `pretrained_path`, `pretrained_revision`), then the policy's own fields, with
  `normalization_mapping` in LeRobot's spelling (`MEAN_STD`). LeRobot's parser refuses a key
  it does not know, so nothing of lr's own goes in it.
- `lr_policy.json` beside it carries lr's contract version (`POLICY_CONFIG_VERSION`), the
  policy type, so lr knows the pair is its own and which version wrote it, and lr's policy
  settings that LeRobot's ACT has no field for: `dtype` (`--policy.dtype`). Version 2 had no
  `dtype`: its policies were float32.

Reading (`load_policy_config`, strict: unknown keys are errors, as in LeRobot's parser):
- with `lr_policy.json`: lr's version 3 (or 2), the layout above;
- without it, and without a `version` key: a folder LeRobot wrote (fields it leaves out take
  their defaults, as LeRobot does);
- `{"version": 1, ...}`: lr's first layout (lr's own field names). Its `act` was lr's earlier
  ACT (its block has `backbone_channels`), whose weights do not fit LeRobot's ACT: refused by name.

`--policy.path=<folder>` starts from it: the parser takes the policy block from this file
(keeping where the run puts and publishes the policy), then merges the other `--policy.*`
flags over it, as lerobot-train does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._configs import PolicyConfig, PolicyConfigBase
from ._errors import ConfigError
from ._serde import from_dict, read_json_object, save_json, to_dict
from .layout import LR_POLICY, MODEL_WEIGHTS, POLICY_CONFIG

__all__ = ["LEROBOT_ONLY_FIELDS", "LR_POLICY_FIELDS", "POLICY_CONFIG_VERSION", "load_policy_config", "lr_policy_dict", "policy_config_dict",
           "save_policy_config"]

POLICY_CONFIG_VERSION = 3
"""lr_policy.json's version: 3 adds `dtype`; 2 is LeRobot's config.json layout; 1 was lr's own (a `version` key in config.json)."""

LR_POLICY_FIELDS = ("dtype",)
"""lr's policy settings kept in lr_policy.json rather than config.json (LeRobot's ACT refuses them)."""

LEROBOT_ONLY_FIELDS = ("use_amp", "use_peft", "tags")
"""LeRobot's common policy fields lr has no setting for: written as LeRobot's defaults (precision
and PEFT are lr's --accelerator.mixed_precision and --peft), ignored when read."""

_LEROBOT_HEAD = ("n_obs_steps", "input_features", "output_features", "device", "use_amp", "use_peft", "push_to_hub",
                 "repo_id", "private", "tags", "license", "pretrained_path", "pretrained_revision")


def policy_config_dict(config: PolicyConfigBase) -> dict[str, Any]:
    """What `config.json` holds for `config`: LeRobot's layout (module docstring)."""
    own = to_dict(config)
    for key in LR_POLICY_FIELDS:
        own.pop(key, None)
    common = {
        "n_obs_steps": own.pop("n_obs_steps", 1),
        "input_features": own.pop("input_features"),
        "output_features": own.pop("output_features"),
        "device": own.pop("device"),
        "use_amp": False,
        "use_peft": False,
        "push_to_hub": own.pop("push_to_hub"),
        "repo_id": own.pop("repo_id"),
        "private": own.pop("private"),
        "tags": None,
        "license": own.pop("license"),
        "pretrained_path": own.pop("path"),
        "pretrained_revision": own.pop("pretrained_revision"),
    }
    norm = {kind: str(mode).upper() for kind, mode in own.pop("normalization_mapping").items()}
    rest: dict[str, Any] = {}
    for key, value in own.items():
        rest[key] = value
        if key == "n_action_steps":
            rest["normalization_mapping"] = norm
    rest.setdefault("normalization_mapping", norm)
    return {"type": config.type_name, **common, **rest}


def save_policy_config(directory: Path, config: PolicyConfigBase) -> None:
    """`config.json` (LeRobot's layout) and `lr_policy.json` (lr's version) in `directory`."""
    save_json(Path(directory) / POLICY_CONFIG, policy_config_dict(config))
    save_json(Path(directory) / LR_POLICY, lr_policy_dict(config))


def lr_policy_dict(config: PolicyConfigBase) -> dict[str, Any]:
    """What `lr_policy.json` holds for `config`: lr's version, the type and lr's own policy settings."""
    return {"version": POLICY_CONFIG_VERSION, "type": config.type_name, **{key: getattr(config, key) for key in LR_POLICY_FIELDS}}


def load_policy_config(directory: Path) -> PolicyConfigBase:
    """The policy config saved in `directory/config.json` (lr's or LeRobot's); errors name --policy.path."""
    directory = Path(directory)
    path = directory / POLICY_CONFIG
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"--policy.path: {directory} is a file; point it at a folder with {POLICY_CONFIG} and {MODEL_WEIGHTS}")
    data = read_json_object(
        path, prefix="--policy.path: ", missing=f" is missing; point it at a folder with {POLICY_CONFIG} and {MODEL_WEIGHTS}"
    )
    if "version" in data:
        return _from_v1(path, data)
    sidecar = directory / LR_POLICY
    if sidecar.exists():
        data = {**data, **_lr_settings(sidecar, data)}
    return _from_lerobot_layout(path, data)


def _lr_settings(sidecar: Path, data: dict[str, Any]) -> dict[str, Any]:
    """lr's own policy settings from `lr_policy.json` (version 2 had none: float32)."""
    mark = read_json_object(sidecar, prefix="--policy.path: ")
    version = mark.get("version")
    if version not in (2, POLICY_CONFIG_VERSION):
        raise ConfigError(f"--policy.path: {sidecar} has version {version!r}; this lr reads versions 2 and {POLICY_CONFIG_VERSION}: upgrade lr")
    if mark.get("type") != data.get("type"):
        raise ConfigError(f"--policy.path: {sidecar} says type {mark.get('type')!r} but {sidecar.parent / POLICY_CONFIG} says "
                          f"{data.get('type')!r}; the two files come from different saves")
    expected = {"version", "type", *(LR_POLICY_FIELDS if version == POLICY_CONFIG_VERSION else ())}
    if set(mark) != expected:
        extra, missing = sorted(set(mark) - expected), sorted(expected - set(mark))
        raise ConfigError(f"--policy.path: {sidecar} " + "; ".join(
            ([f"has unknown keys {', '.join(extra)}"] if extra else []) + ([f"lacks {', '.join(missing)}"] if missing else []))
            + "; lr writes exactly version, type and " + ", ".join(LR_POLICY_FIELDS))
    return {key: mark[key] for key in LR_POLICY_FIELDS if key in mark}


def _from_lerobot_layout(path: Path, data: dict[str, Any]) -> PolicyConfigBase:
    data = dict(data)
    for key in LEROBOT_ONLY_FIELDS:
        value = data.pop(key, None)
        if key == "use_peft" and value:
            raise ConfigError(f"--policy.path: {path} is a LeRobot PEFT adapter (use_peft: true); lr fine-tunes full "
                              "LeRobot models, and its own adapters with --peft.method_type")
    if "pretrained_path" in data:
        data["path"] = data.pop("pretrained_path")
    # LeRobot leaves these unset (null) where lr has a value: unset reads as lr's default
    for key, default in (("private", False), ("license", "apache-2.0"), ("push_to_hub", True)):
        if key in data and data[key] is None:
            data[key] = default
    norm = data.get("normalization_mapping")
    if isinstance(norm, dict):
        data["normalization_mapping"] = {kind: mode.lower() if isinstance(mode, str) else mode for kind, mode in norm.items()}
    kind = data.get("type")
    if kind is not None and "n_obs_steps" in data:
        from ._serde import policy_types

        cls = policy_types().get(str(kind))
        if cls is not None and "n_obs_steps" not in cls.__dataclass_fields__:
            if data.pop("n_obs_steps") != 1:
                raise ConfigError(f"--policy.path: {path}: n_obs_steps must be 1 for a {kind!r} policy")
    config: PolicyConfigBase = from_dict(PolicyConfig, data, source=str(path))  # type: ignore[arg-type]
    return config


def _from_v1(path: Path, data: dict[str, Any]) -> PolicyConfigBase:
    if data.pop("version") != 1:
        raise ConfigError(f"--policy.path: {path} has an unsupported version; expected {POLICY_CONFIG_VERSION} (in {LR_POLICY})")
    if data.get("type") == "act" and "backbone_channels" in data:
        raise ConfigError(
            f"--policy.path: {path} holds lr's earlier ACT (config.json version 1), whose layers and weights are not "
            "LeRobot's ACT that `act` is now; train it again with --policy.type=act"
        )
    config: PolicyConfigBase = from_dict(PolicyConfig, {"pretrained_revision": None, **data}, source=str(path))  # type: ignore[arg-type]
    return config
