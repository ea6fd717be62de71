"""Random number generator state as tensors: captured on every rank, restored per rank.

A checkpoint's `training_state/rng_state.safetensors` holds every rank's generators under
`rank_<r>.<generator>` names: python (`random`), numpy's legacy global generator, torch's
CPU generator and, when CUDA is in use, the current device's CUDA generator. Everything
is an integer or float tensor, so restoring never unpickles anything.

`capture_rng_state` is local (no collectives); the saver gathers the captures to the
main rank. `restore_rng` runs in resume phase 1, on any rank, with no collectives.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from lr_config import CheckpointError
from lr_config.layout import StepFiles
from lr_config.st_format import read_header

__all__ = ["capture_rng_state", "encode_all_ranks", "restore_rng"]


def _python_state() -> dict[str, torch.Tensor]:
    version, words, gauss = random.getstate()
    return {
        "python.version": torch.tensor([version], dtype=torch.int64),
        "python.state": torch.tensor(words, dtype=torch.int64),
        "python.gauss": torch.tensor([] if gauss is None else [gauss], dtype=torch.float64),
    }


def _numpy_state() -> dict[str, torch.Tensor]:
    _, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "numpy.keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
        "numpy.pos": torch.tensor([pos], dtype=torch.int64),
        "numpy.has_gauss": torch.tensor([has_gauss], dtype=torch.int64),
        "numpy.cached_gaussian": torch.tensor([cached], dtype=torch.float64),
    }


def capture_rng_state() -> dict[str, torch.Tensor]:
    """This process's python, numpy, torch CPU (and CUDA, when initialized) RNG state."""
    state = {**_python_state(), **_numpy_state(), "torch.cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["torch.cuda"] = torch.cuda.get_rng_state()
    return state


def encode_all_ranks(per_rank: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """`[rank0_state, rank1_state]` -> `{"rank_0.python.state": ..., "rank_1....": ...}`."""
    return {f"rank_{r}.{key}": value for r, state in enumerate(per_rank) for key, value in state.items()}


def _set_python(state: dict[str, torch.Tensor]) -> None:
    gauss = state["python.gauss"].tolist()
    version = int(state["python.version"].item())
    random.setstate((version, tuple(int(w) for w in state["python.state"].tolist()), gauss[0] if gauss else None))


def _set_numpy(state: dict[str, torch.Tensor]) -> None:
    keys = state["numpy.keys"].numpy().astype(np.uint32)
    np.random.set_state(
        ("MT19937", keys, int(state["numpy.pos"].item()), int(state["numpy.has_gauss"].item()), float(state["numpy.cached_gaussian"].item()))
    )


def _apply(state: dict[str, torch.Tensor]) -> None:
    _set_python(state)
    _set_numpy(state)
    torch.set_rng_state(state["torch.cpu"])
    if "torch.cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["torch.cuda"])


_REQUIRED = ("python.version", "python.state", "python.gauss", "numpy.keys", "numpy.pos", "numpy.has_gauss", "numpy.cached_gaussian", "torch.cpu")


def _read_rank(path: Path, rank: int) -> dict[str, torch.Tensor] | None:
    prefix = f"rank_{rank}."
    names = [n for n in read_header(path).tensors if n.startswith(prefix)]
    if not names:
        return None
    with safe_open(str(path), framework="pt") as f:
        state = {n[len(prefix):]: f.get_tensor(n) for n in names}
    missing = [k for k in _REQUIRED if k not in state]
    if missing:
        raise CheckpointError(f"{path}: rank {rank} lacks {', '.join(missing)}; the file is damaged")
    return state


def restore_rng(step_dir: Path, rank: int) -> bool:
    """Restore `rank`'s python, numpy, torch (and CUDA) generators from a checkpoint.

    Resume phase 1: any rank, no collectives. Returns False when the checkpoint holds no
    state for `rank` (it was saved by fewer processes); the caller reseeds and warns.
    """
    path = StepFiles(Path(step_dir)).rng
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found; the checkpoint is incomplete (resume without it by reseeding)")
    state = _read_rank(path, rank)
    if state is None:
        return False
    try:
        _apply(state)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: rank {rank}'s RNG state is invalid ({exc}); the file is damaged") from None
    return True
