"""Mixed precision: one rule per layout, from `--accelerator.mixed_precision`.

- single process and DDP: `torch.autocast` around the forward (bf16 or fp16);
- FSDP2/HSDP: a `MixedPrecisionPolicy` (bf16 -> param bf16, reduce fp32; fp16 -> param
  fp16, reduce fp32), and no autocast. When any
  `--accelerator.fsdp.mixed_precision_policy.*` field is set, the policy is built from
  those fields alone; unset fields keep torch's defaults, so an unset `reduce_dtype`
  follows torch's rule: gradients are reduced in `param_dtype` (no separate reduce cast).
- fp16 always builds a `GradScaler`; the inf/NaN decision is made on the global gradient
  norm (an all-reduce on sharded runs), so every rank skips the same steps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from lr_config import TrainConfig
from torch.distributed.fsdp import MixedPrecisionPolicy

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_PRECISION = {"bf16": torch.bfloat16, "fp16": torch.float16}


def fsdp_mixed_precision(cfg: TrainConfig) -> MixedPrecisionPolicy | None:
    explicit = cfg.accelerator.fsdp.mixed_precision_policy
    if explicit.is_set():
        return MixedPrecisionPolicy(
            param_dtype=_DTYPES[explicit.param_dtype] if explicit.param_dtype else None,
            reduce_dtype=_DTYPES[explicit.reduce_dtype] if explicit.reduce_dtype else None,
            output_dtype=_DTYPES[explicit.output_dtype] if explicit.output_dtype else None,
            cast_forward_inputs=True if explicit.cast_forward_inputs is None else explicit.cast_forward_inputs,
        )
    dtype = _PRECISION.get(cfg.accelerator.mixed_precision)
    if dtype is None:
        return None
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


@contextlib.contextmanager
def autocast_for(cfg: TrainConfig, device: torch.device, sharded: bool) -> Iterator[None]:
    dtype = _PRECISION.get(cfg.accelerator.mixed_precision)
    if dtype is None or sharded:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield


def make_scaler(cfg: TrainConfig, device: torch.device) -> torch.amp.GradScaler | None:
    if cfg.accelerator.mixed_precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type)
