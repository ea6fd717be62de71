"""The one public gather of full model weights (used by saves and by lr-publish)."""

from __future__ import annotations

import torch
from torch import nn

from ._state import full_model_state

__all__ = ["gather_model_state_dict"]


def gather_model_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Collective: the full CPU state dict (FQN keys, master dtype) on the main rank, {} elsewhere.

    Works for plain, DDP-wrapped and fully_shard-ed modules, with or without a process
    group. Every rank must call it. Tensors of a module that is not distributed may share
    memory with its live parameters: copy them before changing the module.
    """
    return full_model_state(model)
