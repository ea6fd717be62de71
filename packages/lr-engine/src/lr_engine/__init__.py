"""lr-engine: policies, datasets and one training loop for every layout.

Public API (everything else, including the submodules' other names, is implementation):

- `train(cfg, ctx)` / `init_distributed(cfg)`: what `lr-engine train` runs on every rank;
- `plan_lines(cfg, world_size)`: the `--dry_run` plan as text;
- `make_policy`, `load_pretrained`, `save_pretrained`, `Policy`: the policies (`act`, `mlp`);
- `LeRobotDataset`, `make_demo_dataset`, `resolve_dataset_root`: LeRobot v3 data;
- `load_processors`: the normalizer/unnormalizer saved beside a model;
- `load_adapter_policy`: a base policy plus trained LoRA adapters.
"""

from .adapters import load_adapter_policy
from .data.dataset import LeRobotDataset, resolve_dataset_root
from .data.demo import make_demo_dataset
from .parallel.dist import init_distributed
from .plan import plan_lines
from .policies import Policy, load_pretrained, make_policy, save_pretrained
from .processors import load_processors
from .train import train

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
