"""Resume phase 2: load model and optimizer state into the wrapped model, any layout.

Collective: every rank calls `load_model_and_optimizer` after wrapping (plain, DDP,
FSDP2 or HSDP, with or without a process group). Each part is read from DCP shards when
the checkpoint has them (DCP reshards onto the current mesh) and from the gathered
safetensors file otherwise: a sharded model's ranks each read their own rows of it into
their shards (`read_local_shards`); a plain or DDP model's main rank reads it whole, into
the live tensors, and torch broadcasts it to the other ranks.
Whoever reads a file first checks it against the model (names, shapes, optimizer groups):
the main rank for what it reads whole, every rank for DCP shards and rows. Each part ends
in one agreement (`run_on_main`, `run_on_every_rank`), where every rank raises the same
`CheckpointError` on a mismatch, so a bad checkpoint never hangs a job or ends in a raw
traceback. A sharded part costs that one small collective: DCP's load plan needs no
coordination (its global step returns each rank's plan unchanged), so each rank runs the
load alone (`load_in_place`) instead of through DCP's three collectives of pickled plans.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict
from lr_config import CheckpointError
from lr_config.layout import StepFiles, resolve_step_dir
from lr_config.st_format import read_header

from ._formats.dcp.metadata import read_whole_dcp_metadata
from ._formats.dcp.read import load_in_place
from ._formats.json_files import read_optimizer_json
from ._formats.safetensors.read import read_local_shards, read_tensors
from ._io.checksums import ChecksumCheck
from ._ranks import collector_paused, run_on_every_rank, run_on_main
from ._state.state_dicts import (
    is_sharded,
    join_optimizer_state,
    load_full_model_state,
    load_full_optimizer_state,
    local_model_state,
    local_optimizer_state,
    split_optimizer_state,
)

__all__ = ["load_model_and_optimizer", "saved_shapes"]

Shapes = dict[str, tuple[int, ...]]


def saved_shapes(source: Path) -> Shapes:
    """Tensor name -> shape of a safetensors file or a DCP folder (headers only, checked)."""
    if source.is_dir():
        return {k: t.shape for k, t in read_whole_dcp_metadata(source).tensors.items()}
    return read_header(source).shapes()


def _shapes_of(tensors: dict[str, torch.Tensor]) -> Shapes:
    return {k: tuple(v.shape) for k, v in tensors.items()}


def _listed(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _check_shapes(source: Path, expected: Shapes, what: str) -> None:
    saved = saved_shapes(source)
    missing = sorted(set(expected) - set(saved))
    unexpected = sorted(set(saved) - set(expected))
    reshaped = sorted(k for k in set(expected) & set(saved) if expected[k] != saved[k])
    problems = [
        f"missing {_listed(missing)}" if missing else "",
        f"not in this {what}: {_listed(unexpected)}" if unexpected else "",
        "different shapes: " + _listed([f"{k} {saved[k]} vs {expected[k]}" for k in reshaped]) if reshaped else "",
    ]
    if any(problems):
        raise CheckpointError(
            f"{source}: does not match this {what} ({'; '.join(p for p in problems if p)}); "
            f"resume with the same policy and optimizer settings as the run that saved it"
        )


def _check_groups(path: Path, saved: dict[str, Any], current: dict[str, Any]) -> None:
    before = [g["params"] for g in saved["param_groups"]]
    now = [g["params"] for g in current["param_groups"]]
    if before != now:
        raise CheckpointError(
            f"{path}: the optimizer's parameter groups differ from this run's "
            f"({len(before)} groups of {[len(p) for p in before]} parameters saved, {len(now)} of {[len(p) for p in now]} now); "
            "resume with the same model, PEFT and optimizer settings"
        )


def _missing_model(files: StepFiles) -> CheckpointError:
    return CheckpointError(
        f"{files.pretrained}: has neither {files.model.name} nor DCP shards ({files.model_dcp.name}/); the checkpoint is incomplete"
    )


def _load_model(files: StepFiles, model: nn.Module, check: ChecksumCheck) -> None:
    """Weights onto the current layout; an adapter checkpoint fills the trainable tensors only."""
    adapter = files.is_adapter
    local = local_model_state(model, trainable_only=adapter)
    if files.has_model_dcp():

        def load_shards() -> None:
            _check_shapes(files.model_dcp, _shapes_of(local), "model")
            load_in_place(local, files.model_dcp)

        run_on_every_rank(load_shards, f"loading {files.model_dcp}")
        set_model_state_dict(model, dict(local), options=StateDictOptions(strict=not adapter))
        return
    if not files.model.is_file():
        raise _missing_model(files)
    if is_sharded(model):
        # each rank reads its own rows of the gathered file into its shards, as DCP would
        def read_rows() -> None:
            _check_shapes(files.model, _shapes_of(local), "model")
            read_local_shards(files.model, local)

        run_on_every_rank(read_rows, f"reading {files.model}")
        set_model_state_dict(model, dict(local), options=StateDictOptions(strict=not adapter))
        return
    full: dict[str, torch.Tensor] = {}

    def read() -> None:
        _check_shapes(files.model, _shapes_of(local), "model")
        saved, digest = read_tensors(files.model, into=local, sha256=check.needs_sha256(files.model))
        assert digest is not None
        check.record(files.model, digest)
        full.update(saved)

    run_on_main(read, f"reading {files.model}")
    load_full_model_state(model, full, strict=not adapter)


def _read_sharded_optimizer(
    files: StepFiles, source: Path, tensors: dict[str, torch.Tensor], current: dict[str, Any], read: Callable[[], None]
) -> dict[str, Any]:
    """Collective: on every rank, the saved groups and tensor shapes against this optimizer,
    then `read` (this rank's part of `source` into `tensors`); the saved groups' JSON."""
    extra: dict[str, Any] = {}

    def check_and_read() -> None:
        extra.update(read_optimizer_json(files.optimizer_groups))
        _check_groups(files.optimizer_groups, extra, current)
        _check_shapes(source, _shapes_of(tensors), "optimizer")
        read()

    run_on_every_rank(check_and_read, f"loading {source}")
    return extra


def _load_optimizer_dcp(files: StepFiles, model: nn.Module, optimizer: torch.optim.Optimizer, template: dict[str, Any]) -> None:
    tensors, current = split_optimizer_state(template)
    extra = _read_sharded_optimizer(files, files.optimizer_dcp, tensors, current, lambda: load_in_place(tensors, files.optimizer_dcp))
    set_optimizer_state_dict(model, optimizer, join_optimizer_state(tensors, extra, template["param_groups"]))


def _load_optimizer_full(files: StepFiles, model: nn.Module, optimizer: torch.optim.Optimizer, template: dict[str, Any]) -> None:
    tensors, current = split_optimizer_state(template)
    if is_sharded(model):  # each rank reads its own rows, as for the model
        extra = _read_sharded_optimizer(files, files.optimizer, tensors, current, lambda: read_local_shards(files.optimizer, tensors))
        set_optimizer_state_dict(model, optimizer, join_optimizer_state(tensors, extra, template["param_groups"]))
        return
    osd: dict[str, Any] = {}

    def read() -> None:
        extra = read_optimizer_json(files.optimizer_groups)
        _check_groups(files.optimizer_groups, extra, current)
        _check_shapes(files.optimizer, _shapes_of(tensors), "optimizer")
        saved, _ = read_tensors(files.optimizer, hash_it=False, into=tensors)  # hashed by `check` meanwhile
        osd.update(join_optimizer_state(saved, extra, template["param_groups"]))

    run_on_main(read, f"reading {files.optimizer}")
    load_full_optimizer_state(model, optimizer, osd)


def _load_optimizer(files: StepFiles, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    if files.has_optimizer_dcp():
        _load_optimizer_dcp(files, model, optimizer, local_optimizer_state(model, optimizer))
    elif files.optimizer.is_file():
        _load_optimizer_full(files, model, optimizer, local_optimizer_state(model, optimizer))
    else:
        raise CheckpointError(
            f"{files.training_state}: has neither {files.optimizer.name} nor {files.optimizer_dcp.name}/; "
            "the checkpoint is incomplete (load the weights alone with optimizer=None, e.g. to fine-tune)"
        )


def _unread(files: StepFiles, with_optimizer: bool) -> list[Path]:
    """The files and folders of the step folder this load does not read (`ChecksumCheck`
    leaves them to `verify`): a part's gathered file when its DCP shards are read instead, and
    every optimizer file when no optimizer is loaded."""
    unread = [files.model] if files.has_model_dcp() else []
    if not with_optimizer:
        unread += [files.optimizer, files.optimizer_dcp, files.optimizer_groups]
    elif files.has_optimizer_dcp():
        unread.append(files.optimizer)
    return unread


def load_model_and_optimizer(step_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
    """Collective: load a checkpoint's model (and optimizer) state onto the current layout, then
    compare the files it read with the checksums taken at save (a damaged file raises
    CheckpointError naming it, on every rank, before anything trains on what was loaded;
    files this load does not read are left to `verify_checkpoint`). Python's garbage collector
    is paused meanwhile (`collector_paused`)."""
    with collector_paused():
        _load_model_and_optimizer(step_dir, model, optimizer)


def _load_model_and_optimizer(step_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    files = StepFiles(resolve_step_dir(step_dir))
    # The check overlaps the load. A gathered model.safetensors that the main rank reads whole
    # (plain and DDP models) is hashed as it is read; every other file (the optimizer's, DCP
    # shards, a gathered file that FSDP2 ranks read by rows) is hashed from the start in
    # background threads, so the optimizer's file is hashed while the model loads.
    read_whole = not files.has_model_dcp() and not is_sharded(model)
    check = ChecksumCheck(files.root, read_by_main=[files.model] if read_whole else [], unread=_unread(files, optimizer is not None))
    try:
        _load_model(files, model, check)
        if optimizer is not None:
            _load_optimizer(files, model, optimizer)
    except BaseException:
        check.cancel()
        raise
    check.finish()
