"""The data passed in and out of saves and resumes (no torch import at runtime)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lr_config import TrainConfig, TrainingStep

if TYPE_CHECKING:
    import torch

__all__ = ["ResumeState", "SaveRequest"]


@dataclass
class SaveRequest:
    """Everything one checkpoint holds; built by the engine on every rank.

    The format comes from `train_config.checkpoint_format` (non-sharded models always
    save `safetensors`), retention from `.checkpoint_keep`, background writing from
    `.checkpoint_async` (DCP formats only). `write_pretrained` runs on the main rank only,
    with the temporary `pretrained_model/` folder: it writes config.json and processors.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    train_config: TrainConfig
    training_step: TrainingStep
    scheduler_state: dict[str, Any]
    scaler_state: dict[str, Any] | None
    write_pretrained: Callable[[Path], None]


@dataclass
class ResumeState:
    """What resume phase 1 needs before the model is wrapped."""

    training_step: TrainingStep
    scheduler_state: dict[str, Any]
    scaler_state: dict[str, Any] | None
