"""Publishing from files: an existing publish folder, or a saved checkpoint (one process).

Every entry point first validates the repo id and finds a token, then writes and checks
the publish folder locally, and only then talks to the Hub. A failed push therefore loses
nothing: the folder stays, and the error carries the command that retries it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from lr_config import TrainingStep
from lr_config.layout import CHECKPOINTS, StepFiles

from ._folder import (
    check_publish_folder,
    copy_checkpoint_files,
    default_publish_folder,
    staged_folder,
    weights_kind,
    write_card,
)
from ._hub import HubTarget, check_publish_settings, push_folder, resolve_endpoint

__all__ = ["build_publish_folder_from_checkpoint", "publish_checkpoint", "publish_folder", "push_checked_folder"]

log = logging.getLogger("lr_publish")


def _step_and_training_step(step_dir: Path) -> tuple[Path, TrainingStep]:
    from lr_checkpoint import read_training_step, resolve_step_dir

    step = resolve_step_dir(Path(step_dir))
    return step, read_training_step(step)


def build_publish_folder_from_checkpoint(step_dir: Path, folder: Path, *, repo_id: str, token: str | None = None) -> Path:
    """Copy a checkpoint's publishable files into a new `folder`, add the card, check it.

    `step_dir` is anything `lr_checkpoint.resolve_step_dir` accepts (a step folder, `last`,
    the run folder...). The checkpoint needs full weights (model.safetensors) or a LoRA
    adapter; DCP shards and training_state/ are never copied.
    """
    step, training_step = _step_and_training_step(step_dir)
    model_dir = StepFiles(step).pretrained
    weights_kind(model_dir)
    with staged_folder(Path(folder), token=token, source=model_dir) as tmp:
        copy_checkpoint_files(model_dir, tmp)
        write_card(tmp, repo_id, training_step)
    return Path(folder)


def checkpoint_publish_folder(step: Path, repo_id: str, step_number: int) -> Path:
    """Where a checkpoint's publish folder goes by default: `<run>/publish/<name>-<step>` for a step
    folder in a run's checkpoints/ (beside checkpoints/), else `publish/<name>-<step>` beside the
    step folder itself (`/data/publish/...` for `/data/000300`, never `/publish`)."""
    base = step.parent.parent if step.parent.name == CHECKPOINTS else step.parent
    return default_publish_folder(base, repo_id, step_number)


def push_checked_folder(folder: Path, repo_id: str, *, private: bool, endpoint: str | None,
                        revision: str | None, token: str | None) -> str:
    """Push a folder already checked by its builder; log and return the repo url."""
    target = HubTarget(repo_id=repo_id, endpoint=resolve_endpoint(endpoint), private=private, revision=revision)
    url = push_folder(Path(folder), target, token=token)
    log.info("Model pushed to %s", url)
    return url


def publish_folder(
    folder: Path,
    repo_id: str,
    *,
    private: bool = False,
    endpoint: str | None = None,
    revision: str | None = None,
    token: str | None = None,
) -> str:
    """Check an existing publish folder and push it as it is; return the repo url.

    This is the retry path (`lr-publish --folder=...`). Raises `PublishError` before any
    network call when the folder cannot be published, `HubPushError` when the Hub refuses
    it, `HubUnavailableError` when the Hub stays unreachable through every retry.
    """
    check_publish_settings(repo_id, token=token)
    check_publish_folder(Path(folder), token=token)
    return push_checked_folder(folder, repo_id, private=private, endpoint=endpoint, revision=revision, token=token)


def publish_checkpoint(
    step_dir: Path,
    repo_id: str,
    *,
    private: bool = False,
    endpoint: str | None = None,
    revision: str | None = None,
    folder: Path | None = None,
    token: str | None = None,
) -> str:
    """Build the publish folder of a checkpoint and push it; return the repo url.

    `folder` defaults to `<output_dir>/publish/<repo name>-<step>` (beside checkpoints/); for a
    step folder outside a run's checkpoints/, to `publish/<repo name>-<step>` beside it.
    This is what `lr-publish --checkpoint_dir=...` and `lr-checkpoint convert --push_to_hub=...` run.
    """
    check_publish_settings(repo_id, token=token)
    step, training_step = _step_and_training_step(step_dir)
    if folder is None:
        folder = checkpoint_publish_folder(step, repo_id, training_step.step)
    build_publish_folder_from_checkpoint(step, folder, repo_id=repo_id, token=token)
    return push_checked_folder(folder, repo_id, private=private, endpoint=endpoint, revision=revision, token=token)
