"""Weights of a trained model as publishable safetensors (main rank, after the gather).

A plain policy becomes `model.safetensors` (the gathered fp32 state dict). A PEFT model
(it has `peft_config`) becomes `adapter_model.safetensors` with the adapter's keys, as
`peft.get_peft_model_state_dict` names them, plus `adapter_config.json` whose
`base_model_name_or_path` is the base the adapters were trained on (`--policy.path`).
peft is imported only for a PEFT model.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from lr_checkpoint import write_tensor_dict
from lr_config.layout import ADAPTER_WEIGHTS, MODEL_WEIGHTS

__all__ = ["write_weights"]


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        inner: torch.nn.Module = model.module
        return inner
    return model


def _tensors(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {key: value.detach().to("cpu").contiguous() for key, value in state_dict.items()}


def write_weights(model: torch.nn.Module, state_dict: dict[str, torch.Tensor], folder: Path, *, base_model: str | None) -> str:
    """Write the weights into `folder`; return 'full' or 'adapter'."""
    inner = _unwrap(model)
    peft_config: dict[str, Any] | None = getattr(inner, "peft_config", None)
    if peft_config is None:
        write_tensor_dict(folder / MODEL_WEIGHTS, _tensors(state_dict), metadata={"format": "pt"})
        return "full"
    from peft import get_peft_model_state_dict

    adapter_name = getattr(inner, "active_adapter", "default")
    adapter = get_peft_model_state_dict(inner, state_dict=state_dict, adapter_name=adapter_name)
    write_tensor_dict(folder / ADAPTER_WEIGHTS, _tensors(adapter), metadata={"format": "pt"})
    config = copy.deepcopy(peft_config[adapter_name])
    config.base_model_name_or_path = base_model
    config.inference_mode = True
    config.save_pretrained(str(folder))
    return "adapter"
