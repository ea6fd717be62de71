"""lr-checkpoint: crash-safe checkpoints that survive a change of topology.

Layout (`lr_config.layout`): `<output_dir>/checkpoints/<step:06d>/{pretrained_model,training_state}/`
and a relative `checkpoints/last` link, switched only once a step folder is complete.
Formats: `safetensors` (gathered weights and optimizer), `dcp` (DCP shards of both) and
`safetensors_dcp` (DCP shards plus gathered weights); single-process and DDP runs always
write `safetensors`.

Saving (collective, every rank):

    >>> path = save_checkpoint(output_dir / "checkpoints", step, SaveRequest(...))
    >>> pending_save()                 # == path while an async DCP save is being written
    >>> wait_for_staging()             # before the next optimizer.step (async DCP saves)
    >>> wait_for_pending_save()        # before exiting: the background commit is done (-> path)

Resuming, in two phases:

    >>> step_dir = resolve_step_dir(config_path)          # phase 1, before wrapping
    >>> state = read_resume_state(step_dir); restore_rng(step_dir, rank)
    >>> load_model_and_optimizer(step_dir, wrapped_model, optimizer)   # phase 2, collective

Offline: `convert_checkpoint` (DCP shards -> model.safetensors, streaming),
`inspect_checkpoint` (headers only) and `verify_checkpoint` (every byte readable), also
as the `lr-checkpoint` CLI.

`model_weights_file` finds the gathered weights for publishing or fine-tuning, and tells
the user to convert a DCP-only checkpoint.

`import lr_checkpoint` does not import torch: resolve_step_dir, model_weights_file,
read_training_step, read_resume_state, inspect_checkpoint and the dataclasses stay light
(for the TUI), and so does convert_checkpoint (it copies shard bytes; only a layout lr never
writes, or `delete_dcp`'s check, goes through DCP and torch); the other names import torch
on first use.

`CheckpointError`, the one user-facing error, is `lr_config.CheckpointError`, a
`ConfigError` (every lr CLI prints it and exits 2), defined beside the checkpoint layout so
that torch-free readers raise it too.

The modules: the verbs here (`_save`, `_resume` phase 1, `_load` phase 2, `_convert`,
`_inspect`, `_verify`, `_request` for the data they take and return, `_ranks` for rank
helpers, `cli`); the files of a checkpoint in `_formats/` (`safetensors/`, `dcp/`, `torch_save`, `cast`, `json_files`,
`fast_paths`); moving bytes to and from disk in `_io/` (`checksums`, `hashing`, `direct_io`,
`writeback`); the training process's side in `_state/` (`state_dicts`, `gathered`, `rng`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lr_config import CheckpointError
from lr_config.layout import list_step_dirs, model_weights_file, resolve_step_dir

from ._inspect import inspect_checkpoint
from ._request import ResumeState, SaveRequest
from ._resume import read_resume_state, read_training_step

if TYPE_CHECKING:
    from ._convert import convert_checkpoint
    from ._formats.safetensors.write import write_tensor_dict
    from ._load import load_model_and_optimizer
    from ._save import pending_save, save_checkpoint, wait_for_pending_save, wait_for_staging
    from ._state.rng import capture_rng_state, restore_rng
    from ._state.state_dicts import gather_model_state_dict
    from ._verify import verify_checkpoint

__all__ = [
    "CheckpointError",
    "ResumeState",
    "SaveRequest",
    "capture_rng_state",
    "convert_checkpoint",
    "gather_model_state_dict",
    "inspect_checkpoint",
    "list_step_dirs",
    "load_model_and_optimizer",
    "model_weights_file",
    "pending_save",
    "read_resume_state",
    "read_training_step",
    "resolve_step_dir",
    "restore_rng",
    "save_checkpoint",
    "verify_checkpoint",
    "wait_for_pending_save",
    "wait_for_staging",
    "write_tensor_dict",
]

_HEAVY = {
    "capture_rng_state": "._state.rng",
    "convert_checkpoint": "._convert",
    "gather_model_state_dict": "._state.state_dicts",
    "load_model_and_optimizer": "._load",
    "pending_save": "._save",
    "restore_rng": "._state.rng",
    "save_checkpoint": "._save",
    "verify_checkpoint": "._verify",
    "wait_for_pending_save": "._save",
    "wait_for_staging": "._save",
    "write_tensor_dict": "._formats.safetensors.write",
}


def __getattr__(name: str) -> Any:
    """Import the torch-dependent parts of the API on first use."""
    if name in _HEAVY:
        return getattr(importlib.import_module(_HEAVY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
