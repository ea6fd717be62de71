"""Publishing the model a training run just finished: called on every rank.

Order (no rank branches at the call site):
1. every rank: validate the repo id (the same on every rank, so all fail alike), then
   `lr_checkpoint.gather_model_state_dict(model)`, a collective: the full fp32 CPU state
   dict on the main rank, `{}` elsewhere (skipped when the caller passes the state it
   gathered already: the end of a training run gathers once);
2. main rank only: find the token, write the publish folder under a temporary name
   (weights, `write_pretrained(dir)` for config.json and the processors, train_config.json,
   README.md), check it, rename it to `folder`, push it with retries;
3. every rank: meet at a barrier when torch.distributed is initialized, then the main rank
   returns the url or re-raises its failure; the other ranks return None.

A failure on the main rank is held until after the barrier, so the other ranks never wait
forever. `write_pretrained` runs on the main rank only and must not call collectives.
torch is imported on call, so `import lr_publish` (and the `lr-publish` CLI) stays light.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from lr_config import TrainConfig, TrainingStep, check_repo_id, save_json, to_dict
from lr_config.layout import TRAIN_CONFIG

from ._folder import staged_folder, write_card
from ._hub import check_publish_settings
from ._publish import push_checked_folder

if TYPE_CHECKING:
    import torch

__all__ = ["publish_trained_model"]


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _write_folder(
    model: torch.nn.Module,
    state_dict: dict[str, torch.Tensor],
    folder: Path,
    *,
    train_config: TrainConfig,
    training_step: TrainingStep,
    write_pretrained: Callable[[Path], None],
    repo_id: str,
    token: str | None,
) -> None:
    from ._weights import write_weights

    base = str(train_config.policy.path) if train_config.policy.path is not None else None
    with staged_folder(folder, token=token, flag="--output_dir") as tmp:  # the engine's folder is under it
        write_weights(model, state_dict, tmp, base_model=base)
        write_pretrained(tmp)
        save_json(tmp / TRAIN_CONFIG, to_dict(train_config))
        write_card(tmp, repo_id, training_step)


def publish_trained_model(
    model: torch.nn.Module,
    *,
    state_dict: dict[str, torch.Tensor] | None = None,
    train_config: TrainConfig,
    training_step: TrainingStep,
    write_pretrained: Callable[[Path], None],
    repo_id: str,
    private: bool = False,
    endpoint: str | None = None,
    revision: str | None = None,
    token: str | None = None,
    folder: Path,
) -> str | None:
    """Gather, write, check and push the trained model (see the module docstring); every rank calls it.
    `state_dict`: the full state the caller gathered already (the main rank's; {} elsewhere), so the
    end of a training run gathers once for its own folder and the publish."""
    import torch.distributed as dist
    from lr_checkpoint import gather_model_state_dict

    check_repo_id(repo_id, flag="--policy.repo_id")
    if state_dict is None:
        state_dict = gather_model_state_dict(model)
    url: str | None = None
    failure: Exception | None = None
    if not _distributed() or dist.get_rank() == 0:
        try:
            check_publish_settings(repo_id, token=token, flag="--policy.repo_id")
            _write_folder(model, state_dict, Path(folder), train_config=train_config, training_step=training_step,
                          write_pretrained=write_pretrained, repo_id=repo_id, token=token)
            url = push_checked_folder(Path(folder), repo_id, private=private, endpoint=endpoint,
                                      revision=revision, token=token)
        except Exception as exc:  # held until every rank has met at the barrier
            failure = exc
    if _distributed():
        dist.barrier()
    if failure is not None:
        raise failure
    return url
