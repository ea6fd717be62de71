"""The checkpoint layout: every folder and file name of a run and its checkpoints, the step
folder a user meant, `last`, and the run folder of a checkpoint. Nothing else in lr spells
these names (tests/test_architecture.py checks it); pure Python, no torch.

```
<output_dir>/
  train_config.json, run.json, metrics.jsonl
  pretrained_model/   the exported model, written at the end of the run
  checkpoints/<step:06d>/
    pretrained_model/   config.json, train_config.json, model.safetensors,
                        pytorch_model_fsdp_0/ (DCP), processors (engine callback)
    training_state/     training_step.json, rng_state.safetensors, scheduler_state.json,
                        optimizer_state.safetensors, optimizer_param_groups.json,
                        optimizer_0/ (DCP), scaler_state.json (fp16)
  checkpoints/last -> <step:06d>   (relative symlink)
  eval/<step:06d>/videos/   rollouts of the --eval_freq evaluations (--eval.videos)
```

Saves write under a temporary name (`.tmp-<step>-<token>`) and rename it when complete;
readers never look at dot-names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ._errors import CheckpointError

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "CHECKPOINTS",
    "EVAL_INFO",
    "EVAL_OUTPUTS",
    "TRAIN_EVALS",
    "LAST",
    "METRICS",
    "MODEL_DCP",
    "MODEL_WEIGHTS",
    "OPTIMIZER_DCP",
    "POLICY_CONFIG",
    "LR_POLICY",
    "PRETRAINED",
    "RUN_STATUS",
    "TEMP_PREFIX",
    "TRAINING_STATE",
    "TRAINING_STEP",
    "TRAIN_CONFIG",
    "TRAIN_OUTPUTS",
    "StepFiles",
    "last_train_config",
    "list_step_dirs",
    "model_weights_file",
    "resolve_step_dir",
    "run_folder_of",
    "step_dir_name",
]

CHECKPOINTS = "checkpoints"
LAST = "last"
TEMP_PREFIX = ".tmp-"
PRETRAINED = "pretrained_model"
TRAINING_STATE = "training_state"
MODEL_DCP = "pytorch_model_fsdp_0"
OPTIMIZER_DCP = "optimizer_0"
TRAIN_CONFIG = "train_config.json"
POLICY_CONFIG = "config.json"
LR_POLICY = "lr_policy.json"
"""Beside config.json (LeRobot's layout): lr's version of the pair (lr_config.save_policy_config)."""
MODEL_WEIGHTS = "model.safetensors"
TRAINING_STEP = "training_step.json"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
RUN_STATUS = "run.json"
METRICS = "metrics.jsonl"
EVAL_INFO = "eval_info.json"
TRAIN_OUTPUTS = Path("outputs") / "train"
"""Where a run goes without --output_dir: `<TRAIN_OUTPUTS>/<date>/<time>_<job>` (relative to the working folder)."""
EVAL_OUTPUTS = Path("outputs") / "eval"
"""Where `lr-engine eval` writes without --output_dir: `<EVAL_OUTPUTS>/<date>/<time>_<policy>`."""
TRAIN_EVALS = "eval"
"""In a run folder: the videos of the `--eval_freq` evaluations (`--eval.videos`), `eval/<step>/videos/`."""

_WHAT_TO_PASS = (
    "pass a step folder such as <output_dir>/checkpoints/000100, its pretrained_model/, "
    "its train_config.json, the checkpoints/last link, or the checkpoints/ folder"
)


@dataclass(frozen=True)
class StepFiles:
    """Every path of one step folder (the files need not exist)."""

    root: Path

    @classmethod
    def of_train_config(cls, train_config: Path) -> StepFiles:
        """The step folder whose `pretrained_model/train_config.json` is `train_config` (the
        file a resume's `--config_path` comes to)."""
        return cls(Path(train_config).parent.parent)

    @property
    def pretrained(self) -> Path:
        return self.root / PRETRAINED

    @property
    def training_state(self) -> Path:
        return self.root / TRAINING_STATE

    @property
    def config(self) -> Path:
        return self.pretrained / POLICY_CONFIG

    @property
    def train_config(self) -> Path:
        return self.pretrained / TRAIN_CONFIG

    @property
    def is_adapter(self) -> bool:
        """A PEFT checkpoint: its weights are the trainable tensors only (adapters)."""
        return (self.pretrained / ADAPTER_CONFIG).is_file()

    @property
    def model(self) -> Path:
        """The gathered weights: `adapter_model.safetensors` for PEFT checkpoints."""
        return self.pretrained / (ADAPTER_WEIGHTS if self.is_adapter else MODEL_WEIGHTS)

    @property
    def model_dcp(self) -> Path:
        return self.pretrained / MODEL_DCP

    @property
    def training_step(self) -> Path:
        return self.training_state / TRAINING_STEP

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
        return self.training_state / OPTIMIZER_DCP

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
        if path.name == TRAIN_CONFIG and path.parent.name == PRETRAINED:
            return path.parent.parent
        raise CheckpointError(f"{path}: not a checkpoint; {_WHAT_TO_PASS}")
    if path.name == PRETRAINED:
        return path.parent
    if path.name == LAST or path.is_symlink():
        return _follow_last(path)
    for link in (path / LAST, path / CHECKPOINTS / LAST):
        if link.is_symlink() or link.exists():
            return _follow_last(link)
    return path


def _no_last_hint(path: Path) -> str:
    for folder in (path, path / CHECKPOINTS):
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


def last_train_config(checkpoints: Path) -> Path:
    """`<checkpoints>/last/pretrained_model/train_config.json` (the file need not exist)."""
    return StepFiles(Path(checkpoints) / LAST).train_config


def run_folder_of(config_file: Path) -> Path | None:
    """The run folder holding the checkpoint whose train_config.json is `config_file`
    (`<run>/checkpoints/<step or last>/pretrained_model/train_config.json`, or the run's own
    `<run>/train_config.json` beside `checkpoints/`); None for a file elsewhere. A relative
    path counts from the working folder (`--config_path=last` from inside `checkpoints/`);
    links are not followed, so `last` stays a step of the same run."""
    parents = Path(os.path.abspath(config_file)).parents
    if len(parents) > 3 and parents[0].name == PRETRAINED and parents[2].name == CHECKPOINTS:
        return parents[3]
    if (parents[0] / CHECKPOINTS).is_dir():
        return parents[0]
    return None
