"""Normalization before the policy and un-normalization after it.

Statistics come from the dataset's `meta/stats.json`; the mode per feature type (mean_std,
min_max, identity) comes from the policy config's `normalization_mapping`.

Saved beside the model in LeRobot's processor layout, which LeRobot 0.6.1's
`make_pre_post_processors` reads as it is:
- `policy_preprocessor.json`: steps `rename_observations_processor` (empty map),
  `to_batch_processor`, `device_processor`, `normalizer_processor`, its statistics in
  `policy_preprocessor_step_3_normalizer_processor.safetensors`;
- `policy_postprocessor.json`: `unnormalizer_processor` (statistics in
  `policy_postprocessor_step_0_unnormalizer_processor.safetensors`), `device_processor`.
lr's contract version is the top-level `version` key (2), which LeRobot's reader ignores.
`load_processors(dir)` reads that, LeRobot's own files (no `version`) and lr's version 1
(one normalizer step of lr's own). Processors hold no trainable state and run on whatever
device the batch is on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lr_config import ConfigError, FeatureSpec, read_json_object, save_json
from lr_checkpoint import write_tensor_dict
from safetensors import SafetensorError
from safetensors.torch import load_file

PROCESSOR_VERSION = 2
_EPS = 1e-8
_STAT_NAMES = ("mean", "std", "min", "max")
_MODES = {"mean_std": "MEAN_STD", "min_max": "MIN_MAX", "identity": "IDENTITY"}
PRE_NAME = "policy_preprocessor"
POST_NAME = "policy_postprocessor"


@dataclass
class Normalizer:
    """Maps raw features to normalized ones (`inverse=True`: the way back)."""

    features: dict[str, FeatureSpec]
    norm_map: dict[str, str]
    stats: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    inverse: bool = False
    # the statistics as (a, b) on the device and dtype of the batches seen: copied once, not
    # at every call (a copy from host memory to a GPU waits for the GPU's queued work)
    _placed: dict[tuple[str, torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def from_dataset_stats(cls, features: dict[str, FeatureSpec], norm_map: dict[str, str], raw: dict[str, Any], *, inverse: bool = False) -> Normalizer:
        stats: dict[str, dict[str, torch.Tensor]] = {}
        for key, feat in features.items():
            mode = norm_map.get(feat.type, "identity")
            if mode == "identity":
                continue
            if key not in raw:
                raise ConfigError(f"meta/stats.json has no statistics for {key!r}, needed for {mode} normalization "
                                  f"(set --policy.normalization_mapping to identity for {feat.type})")
            needed = ("mean", "std") if mode == "mean_std" else ("min", "max")
            missing = [n for n in needed if n not in raw[key]]
            if missing:
                raise ConfigError(f"meta/stats.json has no {'/'.join(missing)} for {key!r}, needed for {mode} normalization")
            # every statistic the file has for it, so the saved processors are as complete as LeRobot's
            stats[key] = {n: torch.as_tensor(raw[key][n], dtype=torch.float32) for n in _STAT_NAMES if n in raw[key]}
        return cls(features=features, norm_map=norm_map, stats=stats, inverse=inverse)

    def mode(self, key: str) -> str:
        return self.norm_map.get(self.features[key].type, "identity") if key in self.stats else "identity"

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = dict(batch)
        for key in self.stats:
            if key not in out:
                continue
            x = out[key]
            a, b = self._stats_for(key, x)
            if self.mode(key) == "mean_std":
                out[key] = x * (b + _EPS) + a if self.inverse else (x - a) / (b + _EPS)
            else:
                scale = (b - a).clamp_min(_EPS)
                out[key] = (x + 1) / 2 * scale + a if self.inverse else (x - a) / scale * 2 - 1
        return out

    def _stats_for(self, key: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) or (min, max) of `key` on `x`'s device and in its dtype."""
        where = (key, x.device, x.dtype)
        if where not in self._placed:
            st = self.stats[key]
            a, b = (st["mean"], st["std"]) if self.mode(key) == "mean_std" else (st["min"], st["max"])
            self._placed[where] = (a.to(x.device, x.dtype), b.to(x.device, x.dtype))
        return self._placed[where]

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {f"{key}.{name}": t.contiguous() for key, st in self.stats.items() for name, t in st.items()}

    def step_config(self) -> dict[str, Any]:
        """The (un)normalizer step's `config` in LeRobot's layout."""
        return {
            "eps": _EPS,
            "features": {k: {"type": f.type, "shape": list(f.shape)} for k, f in self.features.items()},
            "norm_map": {kind: _MODES[mode] for kind, mode in self.norm_map.items()},
        }

    @classmethod
    def from_step(cls, config: dict[str, Any], flat: dict[str, torch.Tensor], *, inverse: bool, where: Path) -> Normalizer:
        try:
            features = {k: FeatureSpec(type=v["type"], shape=[int(n) for n in v["shape"]]) for k, v in config["features"].items()}
            norm_map = {str(kind): str(mode).lower() for kind, mode in config["norm_map"].items()}
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ConfigError(f"{where}: a normalizer step without readable features and norm_map ({exc})") from None
        unknown = sorted(set(norm_map.values()) - set(_MODES))
        if unknown:
            raise ConfigError(f"{where}: normalization {', '.join(m.upper() for m in unknown)} is not one lr applies "
                              "(MEAN_STD, MIN_MAX, IDENTITY)")
        stats: dict[str, dict[str, torch.Tensor]] = {}
        for full, tensor in flat.items():
            key, _, stat = full.rpartition(".")
            if key in features and stat in _STAT_NAMES and norm_map.get(features[key].type, "identity") != "identity":
                stats.setdefault(key, {})[stat] = tensor.float()
        for key, feat in features.items():
            mode = norm_map.get(feat.type, "identity")
            needed = ("mean", "std") if mode == "mean_std" else ("min", "max") if mode == "min_max" else ()
            if any(n not in stats.get(key, {}) for n in needed):
                raise ConfigError(f"{where}: no {'/'.join(needed)} statistics for {key!r} ({mode.upper()})")
        return cls(features=features, norm_map=norm_map, stats=stats, inverse=inverse)


def _pre_steps(pre: Normalizer, state_file: str) -> list[dict[str, Any]]:
    return [
        {"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
        {"registry_name": "to_batch_processor", "config": {}},
        {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}},
        {"registry_name": "normalizer_processor", "config": pre.step_config(), "state_file": state_file},
    ]


def _post_steps(post: Normalizer, state_file: str) -> list[dict[str, Any]]:
    return [
        {"registry_name": "unnormalizer_processor", "config": post.step_config(), "state_file": state_file},
        {"registry_name": "device_processor", "config": {"device": "cpu", "float_dtype": None}},
    ]


PRE_STATE = f"{PRE_NAME}_step_3_normalizer_processor.safetensors"
POST_STATE = f"{POST_NAME}_step_0_unnormalizer_processor.safetensors"
_PASSIVE_STEPS = {"to_batch_processor", "device_processor"}
"""LeRobot steps with nothing for lr to do: lr batches and places tensors itself."""


def make_processors(inputs: dict[str, FeatureSpec], outputs: dict[str, FeatureSpec], norm_map: dict[str, str], stats: dict[str, Any]) -> tuple[Normalizer, Normalizer]:
    """(preprocessor over inputs and action targets, postprocessor over actions)."""
    pre = Normalizer.from_dataset_stats({**inputs, **outputs}, norm_map, stats)
    post = Normalizer.from_dataset_stats(outputs, norm_map, stats, inverse=True)
    return pre, post


def save_processors(directory: Path, pre: Normalizer, post: Normalizer) -> None:
    directory = Path(directory)
    for name, norm, state_file, steps in ((PRE_NAME, pre, PRE_STATE, _pre_steps(pre, PRE_STATE)),
                                          (POST_NAME, post, POST_STATE, _post_steps(post, POST_STATE))):
        write_tensor_dict(directory / state_file, norm.state_dict())
        save_json(directory / f"{name}.json", {"name": name, "steps": steps, "version": PROCESSOR_VERSION})


def load_processors(directory: Path) -> tuple[Normalizer, Normalizer]:
    return _load(Path(directory), PRE_NAME), _load(Path(directory), POST_NAME)


def _load(directory: Path, name: str) -> Normalizer:
    path = directory / f"{name}.json"
    desc = read_json_object(path, missing=": missing processor description")
    version = desc.get("version")
    if version == 1:
        return _load_v1(directory, path, desc)
    if version not in (None, PROCESSOR_VERSION):
        raise ConfigError(f"{path}: unsupported processor version {version!r} (this lr reads {PROCESSOR_VERSION}, 1 and LeRobot's)")
    steps = desc.get("steps")
    if not isinstance(steps, list):
        raise ConfigError(f"{path}: no list of steps")
    wanted = "unnormalizer_processor" if name == POST_NAME else "normalizer_processor"
    found: Normalizer | None = None
    for step in steps:
        kind = step.get("registry_name") if isinstance(step, dict) else None
        config = step.get("config", {}) if isinstance(step, dict) else {}
        if kind == "rename_observations_processor":
            if config.get("rename_map"):
                raise ConfigError(f"{path}: renames observations ({config['rename_map']}); lr takes the dataset's own names: "
                                  "rename the dataset's features instead")
        elif kind == wanted and found is None:
            state = directory / str(step.get("state_file", ""))
            try:
                flat = load_file(str(state))
            except (OSError, SafetensorError) as exc:
                raise ConfigError(f"{path}: its {wanted} statistics {state.name} cannot be read ({exc})") from None
            found = Normalizer.from_step(config, flat, inverse=name == POST_NAME, where=path)
        elif kind not in _PASSIVE_STEPS:
            raise ConfigError(f"{path}: step {kind or step!r} is not one lr runs (rename, to_batch, device, normalizer, unnormalizer)")
    if found is None:
        raise ConfigError(f"{path}: has no {wanted} step")
    return found


def _load_v1(directory: Path, path: Path, desc: dict[str, Any]) -> Normalizer:
    """lr's first layout: one step {type, features, norm_map, state_file}, lowercase modes."""
    if len(desc.get("steps", [])) != 1:
        raise ConfigError(f"{path}: a version-1 processor has one step")
    step = desc["steps"][0]
    features = {k: FeatureSpec(type=v["type"], shape=list(v["shape"])) for k, v in step["features"].items()}
    flat = load_file(str(directory / step["state_file"]))
    stats: dict[str, dict[str, torch.Tensor]] = {}
    for full, tensor in flat.items():
        key, _, stat = full.rpartition(".")
        stats.setdefault(key, {})[stat] = tensor
    return Normalizer(features=features, norm_map=dict(step["norm_map"]), stats=stats, inverse=step["type"] == "unnormalizer")
