"""lr-engine: policies, datasets and one training loop for every layout.

Public API, the names in `__all__` (the underscore submodules are implementation; `cli` is
the `lr-engine` command):

- `train(cfg, ctx)` / `init_distributed(cfg)`: what `lr-engine train` runs on every rank (`train`
  returns a `TrainResult`: the run folder, whether it stopped on request, the last step);
- `plan_lines(cfg, world_size)`: the `--dry_run` plan as text;
- `make_policy`, `load_pretrained`, `save_pretrained`, `Policy`, `masked_l1`: the policies (`act`,
  `mlp` and the plugins of the `lr.policies` entry point group: docs/plugins.md) and their shared loss;
- `LeRobotDataset`, `make_demo_dataset`, `resolve_dataset_root`: LeRobot v3 data;
- `load_processors`: the normalizer/unnormalizer saved beside a model;
- `load_adapter_policy`: a base policy plus trained LoRA adapters.

The pieces of `train`, for tools that time or measure one part of a run (tools/bench):

- `DistContext`, `launcher_world`, `best_device`, `barrier`: the process layout and its sync;
- `build_run(cfg, ctx) -> Run` (model wrapped, optimizer, data; a resume loaded),
  `start_files(run)`, `train_loop(run)` (the loop over optimizer updates), and inside it
  `train_step` (one update's K micro-batches), `batches`, `forward_backward`, `update`;
- `load_meta`, `DEMO_VERSION`, `make_processors`: a dataset's `meta/`, the demo dataset's
  version, the normalizer built from the dataset's statistics.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._adapters import load_adapter_policy
    from ._data.dataset import LeRobotDataset, load_meta
    from ._data.demo import DEMO_VERSION, make_demo_dataset
    from ._data.locate import resolve_dataset_root
    from ._parallel.dist import DistContext, barrier, best_device, init_distributed, launcher_world
    from ._plan import plan_lines
    from ._policies import Policy, load_pretrained, make_policy, save_pretrained
    from ._policies.base import masked_l1
    from ._processors import load_processors, make_processors
    from ._run import Run
    from ._train import TrainResult, batches, build_run, forward_backward, start_files, train, train_loop, train_step, update

_HOME = {
    "load_adapter_policy": "._adapters",
    "LeRobotDataset": "._data.dataset",
    "resolve_dataset_root": "._data.locate",
    "make_demo_dataset": "._data.demo",
    "init_distributed": "._parallel.dist",
    "plan_lines": "._plan",
    "Policy": "._policies",
    "masked_l1": "._policies.base",
    "load_pretrained": "._policies",
    "make_policy": "._policies",
    "save_pretrained": "._policies",
    "load_processors": "._processors",
    "train": "._train",
    "load_meta": "._data.dataset",
    "DEMO_VERSION": "._data.demo",
    "DistContext": "._parallel.dist",
    "barrier": "._parallel.dist",
    "best_device": "._parallel.dist",
    "launcher_world": "._parallel.dist",
    "make_processors": "._processors",
    "Run": "._run",
    "TrainResult": "._train",
    "batches": "._train",
    "build_run": "._train",
    "forward_backward": "._train",
    "start_files": "._train",
    "train_loop": "._train",
    "train_step": "._train",
    "update": "._train",
}

__all__ = [
    "barrier",
    "batches",
    "best_device",
    "build_run",
    "DEMO_VERSION",
    "DistContext",
    "forward_backward",
    "init_distributed",
    "launcher_world",
    "LeRobotDataset",
    "load_adapter_policy",
    "load_meta",
    "load_pretrained",
    "load_processors",
    "make_demo_dataset",
    "make_policy",
    "make_processors",
    "masked_l1",
    "plan_lines",
    "Policy",
    "resolve_dataset_root",
    "Run",
    "save_pretrained",
    "start_files",
    "train",
    "train_loop",
    "train_step",
    "TrainResult",
    "update",
]


def __getattr__(name: str) -> Any:
    """Import the public API on first use: `python -m lr_engine.cli` imports this package
    first, and a bad flag must exit before torch is imported (lr_engine.cli's contract)."""
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name], __name__), name)
    globals()[name] = value
    return value
