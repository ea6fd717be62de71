"""lr-engine: policies, datasets and one training loop for every layout.

Public API, the names in `__all__` (the underscore submodules are implementation; `cli` is
the `lr-engine` command):

- `train(cfg, ctx)` / `init_distributed(cfg)`: what `lr-engine train` runs on every rank (`train`
  returns a `TrainResult`: the run folder, whether it stopped on request, the last step);
- `plan_lines(cfg, world_size)`: the `--dry_run` plan as text;
- `make_policy`, `load_pretrained`, `save_pretrained`, `Policy`: the policies (`act`, `mlp`);
- `LeRobotDataset`, `make_demo_dataset`, `resolve_dataset_root`: LeRobot v3 data;
- `load_processors`: the normalizer/unnormalizer saved beside a model;
- `load_adapter_policy`: a base policy plus trained LoRA adapters.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._adapters import load_adapter_policy
    from ._data.dataset import LeRobotDataset
    from ._data.locate import resolve_dataset_root
    from ._data.demo import make_demo_dataset
    from ._parallel.dist import init_distributed
    from ._plan import plan_lines
    from ._policies import Policy, load_pretrained, make_policy, save_pretrained
    from ._processors import load_processors
    from ._train import train

_HOME = {
    "load_adapter_policy": "._adapters",
    "LeRobotDataset": "._data.dataset",
    "resolve_dataset_root": "._data.locate",
    "make_demo_dataset": "._data.demo",
    "init_distributed": "._parallel.dist",
    "plan_lines": "._plan",
    "Policy": "._policies",
    "load_pretrained": "._policies",
    "make_policy": "._policies",
    "save_pretrained": "._policies",
    "load_processors": "._processors",
    "train": "._train",
}

__all__ = [
    "LeRobotDataset",
    "Policy",
    "init_distributed",
    "load_adapter_policy",
    "load_pretrained",
    "load_processors",
    "make_demo_dataset",
    "make_policy",
    "plan_lines",
    "resolve_dataset_root",
    "save_pretrained",
    "train",
]


def __getattr__(name: str) -> Any:
    """Import the public API on first use: `python -m lr_engine.cli` imports this package
    first, and a bad flag must exit before torch is imported (lr_engine.cli's contract)."""
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name], __name__), name)
    globals()[name] = value
    return value
