"""Normalization before the policy and un-normalization after it.

Statistics come from the dataset's `meta/stats.json`; the mode per feature type (mean_std,
min_max, identity) comes from the policy config's `normalization_mapping`.

Saved beside the model as `policy_preprocessor.json` / `policy_postprocessor.json` (a
versioned description) with their tensors in `policy_preprocessor_step_0_normalizer.safetensors`
/ `policy_postprocessor_step_0_unnormalizer.safetensors`. `load_processors(dir)` rebuilds
them identically. Processors hold no trainable state and run on whatever device the
batch is on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lr_config import ConfigError, FeatureSpec, read_json_object
from lr_checkpoint import write_tensor_dict
from safetensors.torch import load_file

PROCESSOR_VERSION = 1
_EPS = 1e-8
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
            names = ("mean", "std") if mode == "mean_std" else ("min", "max")
            stats[key] = {n: torch.as_tensor(raw[key][n], dtype=torch.float32) for n in names}
        return cls(features=features, norm_map=norm_map, stats=stats, inverse=inverse)

    def mode(self, key: str) -> str:
        return self.norm_map.get(self.features[key].type, "identity") if key in self.stats else "identity"

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = dict(batch)
        for key, st in self.stats.items():
            if key not in out:
                continue
            x = out[key]
            a, b = self._stats_for(key, x)
            if "mean" in st:
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
            a, b = (st["mean"], st["std"]) if "mean" in st else (st["min"], st["max"])
            self._placed[where] = (a.to(x.device, x.dtype), b.to(x.device, x.dtype))
        return self._placed[where]

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {f"{key}.{name}": t.contiguous() for key, st in self.stats.items() for name, t in st.items()}

    def save(self, directory: Path, name: str) -> None:
        kind = "unnormalizer" if self.inverse else "normalizer"
        state_file = f"{name}_step_0_{kind}.safetensors"
        write_tensor_dict(directory / state_file, self.state_dict())
        desc = {
            "version": PROCESSOR_VERSION,
            "name": name,
            "steps": [
                {
                    "type": kind,
                    "features": {k: {"type": f.type, "shape": f.shape} for k, f in self.features.items()},
                    "norm_map": self.norm_map,
                    "state_file": state_file,
                }
            ],
        }
        (directory / f"{name}.json").write_text(json.dumps(desc, indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path, name: str) -> Normalizer:
        path = directory / f"{name}.json"
        desc = read_json_object(path, missing=": missing processor description")
        if desc.get("version") != PROCESSOR_VERSION or len(desc.get("steps", [])) != 1:
            raise ConfigError(f"{path}: unsupported processor version {desc.get('version')!r}")
        step = desc["steps"][0]
        features = {k: FeatureSpec(type=v["type"], shape=list(v["shape"])) for k, v in step["features"].items()}
        flat = load_file(str(directory / step["state_file"]))
        stats: dict[str, dict[str, torch.Tensor]] = {}
        for full, tensor in flat.items():
            key, _, stat = full.rpartition(".")
            stats.setdefault(key, {})[stat] = tensor
        return cls(features=features, norm_map=dict(step["norm_map"]), stats=stats, inverse=step["type"] == "unnormalizer")


def make_processors(inputs: dict[str, FeatureSpec], outputs: dict[str, FeatureSpec], norm_map: dict[str, str], stats: dict[str, Any]) -> tuple[Normalizer, Normalizer]:
    """(preprocessor over inputs and action targets, postprocessor over actions)."""
    pre = Normalizer.from_dataset_stats({**inputs, **outputs}, norm_map, stats)
    post = Normalizer.from_dataset_stats(outputs, norm_map, stats, inverse=True)
    return pre, post


def save_processors(directory: Path, pre: Normalizer, post: Normalizer) -> None:
    pre.save(directory, PRE_NAME)
    post.save(directory, POST_NAME)


def load_processors(directory: Path) -> tuple[Normalizer, Normalizer]:
    return Normalizer.load(directory, PRE_NAME), Normalizer.load(directory, POST_NAME)
