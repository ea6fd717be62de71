"""The policy protocol and the loss every policy shares; the registry and save/load live in
`registry.py` (which imports the policies, so that none of them imports upward).

A policy is an `nn.Module` built from its lr-config dataclass and the dataset's features:
- `forward(batch) -> (loss, info)`: `info` holds detached scalar tensors (no host sync);
- `predict_action_chunk(batch)` returns `[B, chunk_size, action_dim]` (normalized space);
- `select_action(batch)` pops one action per call from a queue refilled every
  `n_action_steps` calls; `reset()` clears it;
- `_fsdp_wrap_modules`: class names of its repeated blocks (the FSDP units);
- `_fsdp_forward_methods`: entry points besides forward that must work on a sharded model.

`--policy.dtype=bfloat16` (`make_policy` casts the parameters and buffers): the batch's floating
tensors are cast to the policy's dtype as they enter `forward` (a pre-hook, so under DDP, FSDP2
and PEFT alike), `predict_action_chunk` and `select_action` (every subclass's own, wrapped as the
class is defined); a policy's own code sees inputs in its parameters' dtype.
The loss is taken in float32 (`masked_l1`) and `select_action` returns float32 actions. Autocast stays `--accelerator.mixed_precision`'s.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from lr_config import ConfigError, PolicyConfigBase
from torch import nn


class Policy(nn.Module):
    config_class: ClassVar[type[PolicyConfigBase]]
    name: ClassVar[str]
    _fsdp_wrap_modules: ClassVar[list[str]] = []
    _fsdp_forward_methods: ClassVar[list[str]] = ["select_action", "predict_action_chunk"]
    _peft_target_modules: ClassVar[list[str]] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in _BATCH_METHODS:
            if name in cls.__dict__:
                setattr(cls, name, _casting(cls.__dict__[name]))

    def __init__(self, config: PolicyConfigBase) -> None:
        super().__init__()
        if config.input_features is None or config.output_features is None:
            raise ConfigError("--policy.input_features/--policy.output_features: not resolved from the dataset")
        self.config = config
        self.action_key = "action"
        self.action_dim = int(config.output_features[self.action_key].shape[0])
        self._queue: deque[torch.Tensor] = deque()
        self.param_dtype: torch.dtype = getattr(torch, config.dtype)
        if self.param_dtype != torch.float32:
            self.register_forward_pre_hook(_cast_batch_hook)

    def cast_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`batch` with its floating tensors in the policy's dtype (the same dict when float32)."""
        if self.param_dtype == torch.float32:
            return batch
        return {k: v.to(self.param_dtype) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in batch.items()}

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # noqa: D401
        raise NotImplementedError

    def predict_action_chunk(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def reset(self) -> None:
        self._queue.clear()

    @torch.no_grad()
    def select_action(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """One action `[B, action_dim]` per call; a new chunk every `n_action_steps` calls."""
        if not self._queue:
            chunk = self.predict_action_chunk(batch)[:, : self.config.n_action_steps].float()
            self._queue.extend(chunk.transpose(0, 1))
        return self._queue.popleft()


_BATCH_METHODS = ("predict_action_chunk", "select_action")
"""Entry points besides forward that take a batch: a subclass's own are wrapped by `_casting`."""


def _casting(method: Callable[..., Any]) -> Callable[..., Any]:
    """`method(self, batch, ...)` with the batch cast to the policy's dtype first (a no-op in float32)."""

    @functools.wraps(method)
    def wrapper(self: Policy, batch: dict[str, torch.Tensor], *args: Any, **kwargs: Any) -> Any:
        return method(self, self.cast_inputs(batch), *args, **kwargs)

    return wrapper


def _cast_batch_hook(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    if args and isinstance(args[0], dict):
        assert isinstance(module, Policy)
        return (module.cast_inputs(args[0]), *args[1:])
    return None


def masked_l1(pred: torch.Tensor, target: torch.Tensor, is_pad: torch.Tensor | None) -> torch.Tensor:
    """Absolute error averaged over each sample's non-padded steps, then over the batch.

    Normalizing per sample (not by the batch's total count) makes the loss of a batch the
    mean of its samples' losses, so B samples on each of N ranks give exactly the loss and
    gradients of N*B samples on one process, and accumulation over K micro-batches equals
    one K-times larger batch.
    """
    err = (pred.float() - target.float()).abs()
    if is_pad is None:
        return err.mean()
    keep = (~is_pad).unsqueeze(-1).to(err.dtype)
    per_sample = (err * keep).sum(dim=(1, 2)) / (keep.sum(dim=(1, 2)) * err.shape[-1]).clamp_min(1.0)
    return per_sample.mean()
