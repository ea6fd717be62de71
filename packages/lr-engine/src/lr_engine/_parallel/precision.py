"""Mixed precision: one rule per layout, from `--accelerator.mixed_precision`.

- single process and DDP: `torch.autocast` around the forward (bf16 or fp16);
- FSDP2/HSDP: a `MixedPrecisionPolicy` (bf16 -> param bf16, reduce fp32; fp16 -> param
  fp16, reduce fp32), and no autocast. When any
  `--accelerator.fsdp.mixed_precision_policy.*` field is set, the policy is built from
  those fields alone; unset fields keep torch's defaults. An unset `reduce_dtype` follows
  torch's rule, which changed in torch 2.15: from 2.15 on, gradients are reduced in the
  parameter's own dtype (fp32 for lr's fp32 master weights); before, in `param_dtype`.
  `effective_dtypes` says what a run computes, reduces and outputs in; every checkpoint's
  training_step.json records it.
- `--policy.dtype=bfloat16` makes the weights themselves bfloat16 (lr_engine._policies.base);
  autocast and FSDP2's policy above apply over them unchanged.
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


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def reduce_follows_param_dtype(torch_version: str) -> bool:
    """Whether FSDP2 reduces in `param_dtype` when `reduce_dtype` is unset (torch before 2.15)."""
    major, minor = (int(part) for part in torch_version.split(".")[:2])
    return (major, minor) < (2, 15)


def effective_dtypes(cfg: TrainConfig, sharded: bool) -> dict[str, str]:
    """What the run computes in (param_dtype), reduces gradients in (reduce_dtype) and outputs.
    `--policy.dtype` is the weights' own dtype: gradients are reduced in it unless FSDP2's
    policy says otherwise."""
    weights = _DTYPES[cfg.policy.dtype]
    if not sharded:  # gradients in the weights' dtype; autocast computes and outputs in the precision's dtype
        compute = _PRECISION.get(cfg.accelerator.mixed_precision, weights)
        return {"param_dtype": _name(compute), "reduce_dtype": _name(weights), "output_dtype": _name(compute)}
    policy = fsdp_mixed_precision(cfg) or MixedPrecisionPolicy()
    param = policy.param_dtype or weights
    reduce = policy.reduce_dtype
    if reduce is None:
        reduce = param if reduce_follows_param_dtype(torch.__version__) else weights
    return {"param_dtype": _name(param), "reduce_dtype": _name(reduce), "output_dtype": _name(policy.output_dtype or param)}


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
