"""Resume phase 1: what a run needs before it wraps its model (no torch, no collectives).

Any rank may call these, in any order: `read_training_step` for the step, data position
and saved topology; `read_resume_state` adds the scheduler and fp16 scaler states.
"""

from __future__ import annotations

from pathlib import Path

from lr_config import CheckpointError, ConfigError, TrainingStep, load_training_step
from lr_config.layout import StepFiles, resolve_step_dir

from ._formats.json_files import read_json_object
from ._request import ResumeState

__all__ = ["read_resume_state", "read_training_step"]


def read_training_step(step_dir: Path) -> TrainingStep:
    """The `TrainingStep` saved in a checkpoint (any path `resolve_step_dir` accepts)."""
    path = StepFiles(resolve_step_dir(step_dir)).training_step
    try:
        return load_training_step(path)
    except CheckpointError:
        raise
    except ConfigError as exc:
        raise CheckpointError(str(exc), problems=exc.problems) from None


def read_resume_state(step_dir: Path) -> ResumeState:
    """Training step, scheduler state and (fp16 runs) scaler state of a checkpoint."""
    files = StepFiles(resolve_step_dir(step_dir))
    training_step = read_training_step(files.root)
    if training_step.precision == "fp16" and not files.scaler.exists():
        raise CheckpointError(f"{files.scaler}: file not found; an fp16 checkpoint needs its grad scaler state")
    scaler = read_json_object(files.scaler) if files.scaler.exists() else None
    return ResumeState(training_step=training_step, scheduler_state=read_json_object(files.scheduler), scaler_state=scaler)
