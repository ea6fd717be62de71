"""Faults the tests inject into a real run, chosen by environment variables (LR_TEST_*).

- `LR_TEST_RAISE_AT_STEP=S` (+ `LR_TEST_RAISE_RANK=R`, default 0): rank R raises before the
  optimizer update of loop step S, as a crashing rank would.
- `LR_TEST_INF_GRAD_STEP=S` (+ `LR_TEST_INF_GRAD_RANK=R`, default 0): rank R puts an inf into
  the first element of its first gradient (its local shard under FSDP2) before that update,
  as an fp16 overflow on one shard would.

- `LR_TEST_EVAL_DELAY_S=T`: the main rank's first `--eval_freq` evaluation takes T seconds
  longer, as a long rollout would (the other ranks must wait for it without a timeout).

`from_env` reads them once, when the run is built; with none set it returns None and the
loop calls nothing. Steps count from 0 here: S is the update's loop step minus one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn

    from ._parallel.dist import DistContext

FaultHook = Callable[["nn.Module", int], None]


def from_env(ctx: DistContext) -> FaultHook | None:
    """The hook the loop calls before each optimizer update of this rank, or None."""
    raise_at = _step_for(ctx, "LR_TEST_RAISE_AT_STEP", "LR_TEST_RAISE_RANK")
    inf_at = _step_for(ctx, "LR_TEST_INF_GRAD_STEP", "LR_TEST_INF_GRAD_RANK")
    if raise_at is None and inf_at is None:
        return None

    def hook(model: nn.Module, step: int) -> None:
        if step == raise_at:
            raise RuntimeError(f"test fault injected on rank {ctx.rank} at step {step} (t={time.time():.3f})")
        if step == inf_at:
            _inf_in_first_grad(model)

    return hook


def _step_for(ctx: DistContext, step_var: str, rank_var: str) -> int | None:
    step = os.environ.get(step_var)
    if step is None or os.environ.get(rank_var, "0") != str(ctx.rank):
        return None
    return int(step)


def _inf_in_first_grad(model: nn.Module) -> None:
    from torch.distributed.tensor import DTensor

    grad = next(p.grad for p in model.parameters() if p.grad is not None)
    local = grad.to_local() if isinstance(grad, DTensor) else grad
    local.view(-1)[0] = float("inf")


def eval_delay() -> float:
    """Seconds to add to the first evaluation (`LR_TEST_EVAL_DELAY_S`), 0 when unset."""
    return float(os.environ.get("LR_TEST_EVAL_DELAY_S", "0"))
