"""Names and paths of the checkpoint layout; finding the step folder a user meant.

```
<output_dir>/checkpoints/<step:06d>/
  pretrained_model/   config.json, train_config.json, model.safetensors,
                      pytorch_model_fsdp_0/ (DCP), processors (engine callback)
  training_state/     training_step.json, rng_state.safetensors, scheduler_state.json,
                      optimizer_state.safetensors, optimizer_param_groups.json,
                      optimizer_0/ (DCP), scaler_state.json (fp16)
<output_dir>/checkpoints/last -> <step:06d>   (relative symlink)
```

Saves write under a temporary name (`.tmp-<step>-<token>`) and rename it when complete;
readers never look at dot-names. Pure Python: importing this module never imports torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ._errors import CheckpointError

__all__ = [
    "LAST",
    "StepFiles",
    "TEMP_PREFIX",
    "list_step_dirs",
    "model_weights_file",
    "resolve_step_dir",
    "step_dir_name",
]

LAST = "last"
TEMP_PREFIX = ".tmp-"
PRETRAINED = "pretrained_model"
TRAINING_STATE = "training_state"

_WHAT_TO_PASS = (
    "pass a step folder such as <output_dir>/checkpoints/000100, its pretrained_model/, "
    "its train_config.json, the checkpoints/last link, or the checkpoints/ folder"
)


ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


@dataclass(frozen=True)
class StepFiles:
    """Every path of one step folder (the files need not exist)."""

    root: Path

    @property
    def pretrained(self) -> Path:
        return self.root / PRETRAINED

    @property
    def training_state(self) -> Path:
        return self.root / TRAINING_STATE

    @property
    def config(self) -> Path:
        return self.pretrained / "config.json"

    @property
    def train_config(self) -> Path:
        return self.pretrained / "train_config.json"

    @property
    def is_adapter(self) -> bool:
        """A PEFT checkpoint: its weights are the trainable tensors only (adapters)."""
        return (self.pretrained / ADAPTER_CONFIG).is_file()

    @property
    def model(self) -> Path:
        """The gathered weights: `adapter_model.safetensors` for PEFT checkpoints."""
        return self.pretrained / (ADAPTER_WEIGHTS if self.is_adapter else "model.safetensors")

    @property
    def model_dcp(self) -> Path:
        return self.pretrained / "pytorch_model_fsdp_0"

    @property
    def training_step(self) -> Path:
        return self.training_state / "training_step.json"

    @property
    def rng(self) -> Path:
        return self.training_state / "rng_state.safetensors"

    @property
    def scheduler(self) -> Path:
        return self.training_state / "scheduler_state.json"

    @property
    def scaler(self) -> Path:
        return self.training_state / "scaler_state.json"

    @property
    def optimizer(self) -> Path:
        return self.training_state / "optimizer_state.safetensors"

    @property
    def optimizer_groups(self) -> Path:
        return self.training_state / "optimizer_param_groups.json"

    @property
    def optimizer_dcp(self) -> Path:
        return self.training_state / "optimizer_0"

    def has_model_dcp(self) -> bool:
        return (self.model_dcp / ".metadata").is_file()

    def has_optimizer_dcp(self) -> bool:
        return (self.optimizer_dcp / ".metadata").is_file()


def step_dir_name(step: int) -> str:
    """`123` -> `000123` (wider steps keep all their digits)."""
    return f"{step:06d}"


def list_step_dirs(checkpoints_dir: Path) -> list[Path]:
    """Finished step folders of a checkpoints/ folder, oldest first (temp names skipped)."""
    if not checkpoints_dir.is_dir():
        return []
    steps = [p for p in checkpoints_dir.iterdir() if p.name.isdigit() and p.is_dir() and not p.is_symlink()]
    return sorted(steps, key=lambda p: int(p.name))


def _looks_like_step_dir(path: Path) -> bool:
    return (path / PRETRAINED).is_dir() or (path / TRAINING_STATE).is_dir()


def _follow_last(link: Path) -> Path:
    target = link.resolve()
    if not target.is_dir():
        raise CheckpointError(
            f"{link}: the `last` link points to {os.readlink(link)!r}, which does not exist; "
            f"pass one of the step folders next to it instead"
        )
    return target


def _candidate(path: Path) -> Path:
    """The folder `path` designates, before checking that it is a step folder."""
    if path.is_file():
        if path.name == "train_config.json" and path.parent.name == PRETRAINED:
            return path.parent.parent
        raise CheckpointError(f"{path}: not a checkpoint; {_WHAT_TO_PASS}")
    if path.name == PRETRAINED:
        return path.parent
    if path.name == LAST or path.is_symlink():
        return _follow_last(path)
    for link in (path / LAST, path / "checkpoints" / LAST):
        if link.is_symlink() or link.exists():
            return _follow_last(link)
    return path


def _no_last_hint(path: Path) -> str:
    for folder in (path, path / "checkpoints"):
        steps = list_step_dirs(folder)
        if steps:
            names = ", ".join(p.name for p in steps[-3:])
            return f"; {folder} has no `last` link, pass one of its step folders ({names})"
    return ""


def resolve_step_dir(path: Path) -> Path:
    """The absolute step folder meant by `path`.

    Accepts a step folder, its `pretrained_model/`, the `train_config.json` inside it, a
    `last` link, a `checkpoints/` folder (its `last`), or a run folder (its
    `checkpoints/last`). Raises `CheckpointError` naming `path` when it is none of these.
    """
    path = Path(path).expanduser()
    if not path.exists() and not path.is_symlink():
        raise CheckpointError(f"{path}: no such file or folder; {_WHAT_TO_PASS}")
    step_dir = _candidate(path)
    if step_dir.name.startswith(TEMP_PREFIX):
        raise CheckpointError(
            f"{step_dir}: an unfinished save (interrupted before it was renamed); it is not a "
            f"checkpoint, use the `last` link next to it"
        )
    if not _looks_like_step_dir(step_dir):
        raise CheckpointError(f"{path}: not a checkpoint (no {PRETRAINED}/ or {TRAINING_STATE}/ inside){_no_last_hint(path)}; {_WHAT_TO_PASS}")
    return step_dir.resolve()


def model_weights_file(path: Path) -> Path:
    """`pretrained_model/model.safetensors` of the checkpoint at `path`, for whatever needs
    gathered weights (publishing, fine-tuning from `--policy.path`); a DCP-only checkpoint
    is a `CheckpointError` that says which convert command writes the file."""
    files = StepFiles(resolve_step_dir(path))
    if files.model.is_file():
        return files.model
    if files.has_model_dcp():
        raise CheckpointError(
            f"{files.root}: this checkpoint has only DCP shards ({files.model_dcp.name}/), no model.safetensors; "
            f"run `lr-checkpoint convert {files.root}` first"
        )
    raise CheckpointError(f"{files.model}: file not found and no DCP shards either; the checkpoint is incomplete")
