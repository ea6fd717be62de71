"""Collective, crash-safe checkpoint saves.

Every rank calls `save_checkpoint(checkpoints_dir, step, request)` at the same point.
In order:

1. the main rank clears leftovers of interrupted saves and creates
   `checkpoints/.tmp-<step>-<token>/` (token broadcast, so every rank writes there);
2. model data: DCP shards (every rank) and/or the gathered `model.safetensors` (a
   sharded model's tensors gathered one at a time on every rank, each written by the
   main rank while the next is gathered: `_state.gathered`);
3. optimizer data, the same way: `optimizer_0/` DCP shards, or the gathered
   `optimizer_state.safetensors`; `optimizer_param_groups.json` either way;
4. one main-rank block writes the single files: train_config.json, training_step.json,
   scheduler/scaler JSON, every rank's RNG, and the engine's `write_pretrained` callback;
5. checksums: every file's size, SHA-256 and CRC-32 into `checksums.json` (the main rank hashed
   the safetensors files it wrote as it wrote them; the ranks share the rest);
6. commit (main rank): fsync the tree, rename the temp folder to `<step:06d>`, switch
   `last` with an atomic symlink replace, prune to `checkpoint_keep`.

Ranks leave only once the commit is done (or raise if it failed on the main rank). A
crash anywhere before the rename leaves a dot-named temp folder that readers ignore and
the next save deletes; a crash before the `last` switch leaves `last` on the previous
checkpoint. With `checkpoint_async` and a DCP format, steps 2 and 3 copy the state and
write in background threads (their own gloo groups), and steps 5 and 6 run in a commit
thread on every rank (its own gloo group) once the writes are done. The loop waits only
for the copy (`wait_for_staging()` before its next optimizer step); `wait_for_pending_save()`
waits for the commit, and the next save and the end of training call it.

Test hook: `LR_TEST_PAUSE_IN_SAVE=before_shards|between_shards|before_rename|before_last`
makes the main rank write `checkpoints/.paused-<point>` (its pid) and sleep there.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_saver import async_save, save as dcp_save
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from lr_config import CheckpointError, FileDigest, save_json, save_training_step, to_dict
from lr_config.layout import ADAPTER_WEIGHTS, LAST, TEMP_PREFIX, StepFiles, list_step_dirs, step_dir_name

from ._formats.dcp.write import WritebackFileSystemWriter
from ._formats.safetensors.write import write_tensor_dict
from ._io.checksums import write_checksums
from ._request import SaveRequest
from ._state.gathered import write_gathered
from ._ranks import broadcast_value, collector_paused, gather_values, pause_point, run_on_main
from ._state.rng import capture_rng_state, encode_all_ranks
from ._state.state_dicts import full_model_state, full_optimizer_state, is_sharded, local_model_state, local_optimizer_state, split_optimizer_state

__all__ = ["effective_format", "pending_save", "save_checkpoint", "wait_for_pending_save", "wait_for_staging"]

_DCP_FORMATS = ("dcp", "safetensors_dcp")


@dataclass
class _Save:
    """One save in progress: where it writes and where it lands."""

    checkpoints_dir: Path
    tmp: Path
    final: Path
    fmt: str
    keep: int
    background: bool
    uploads: list[Any] = field(default_factory=list)
    staged: list[Any] = field(default_factory=list)
    stagers: list[DefaultStager] = field(default_factory=list)
    digests: dict[str, FileDigest] = field(default_factory=dict)
    # a background save: the DCP writes it hands to its thread, the main-rank blocks that
    # write small files, the thread, the moment its staging futures exist, its failure
    jobs: list[tuple[dict[str, Any], Path]] = field(default_factory=list)
    small_files: list[tuple[Callable[[], None], str]] = field(default_factory=list)
    committer: threading.Thread | None = None
    staging_known: threading.Event = field(default_factory=threading.Event)
    failure: BaseException | None = None

    @property
    def files(self) -> StepFiles:
        return StepFiles(self.tmp)

    def record(self, path: Path, digest: FileDigest) -> None:
        """The main rank's digest of a file it wrote (checksums.json need not read it again)."""
        self.digests[path.relative_to(self.tmp).as_posix()] = digest


_pending: _Save | None = None
_background_groups: dict[str, dist.ProcessGroup] = {}


def effective_format(model: nn.Module, requested: str) -> str:
    """The requested format for sharded models; `safetensors` for single and DDP."""
    return requested if is_sharded(model) else "safetensors"


def _fsync(path: Path) -> None:
    """Flush a file's data, or a folder's entries (renames, new names), to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for folder, _, names in os.walk(root):
        for name in names:
            _fsync(Path(folder) / name)
        _fsync(Path(folder))


def _clear_leftovers(checkpoints_dir: Path) -> None:
    for entry in checkpoints_dir.iterdir():
        if entry.name.startswith(TEMP_PREFIX) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.name.startswith(".last-") and entry.is_symlink():
            entry.unlink(missing_ok=True)


def _begin(checkpoints_dir: Path, step: int, request: SaveRequest) -> _Save:
    fmt = effective_format(request.model, request.train_config.checkpoint_format)
    token = broadcast_value(secrets.token_hex(4))
    name = step_dir_name(step)
    save = _Save(
        checkpoints_dir=checkpoints_dir,
        tmp=checkpoints_dir / f"{TEMP_PREFIX}{name}-{token}",
        final=checkpoints_dir / name,
        fmt=fmt,
        keep=request.train_config.checkpoint_keep,
        background=request.train_config.checkpoint_async and fmt in _DCP_FORMATS,
    )

    def create() -> None:
        checkpoints_dir.mkdir(parents=True, exist_ok=True)
        _clear_leftovers(checkpoints_dir)
        save.files.pretrained.mkdir(parents=True)
        save.files.training_state.mkdir(parents=True)

    run_on_main(create, f"creating {save.tmp}")
    return save


def _background_group(slot: str) -> dist.ProcessGroup:
    """A gloo group per background writer (model, optimizer): each writes from its own
    thread, and collectives of two threads must never share a group (nor the training's)."""
    if slot not in _background_groups:
        _background_groups[slot] = cast(dist.ProcessGroup, dist.new_group(backend="gloo"))
    return _background_groups[slot]


def describe_failure(exc: BaseException) -> str:
    """One line per failing rank for DCP's CheckpointException (whose str is a traceback), else
    `Type: message`."""
    if isinstance(exc, CheckpointException):
        return "; ".join(f"rank {r}: {type(e).__name__}: {e}" for r, (e, _) in sorted(exc.failures.items()))
    return f"{type(exc).__name__}: {exc}"


def _write_dcp(save: _Save, state: dict[str, Any], folder: Path) -> None:
    """Write DCP shards now, or (a background save) hand them to the save's thread."""
    if not save.background:
        try:
            dcp_save(state, storage_writer=WritebackFileSystemWriter(folder))
        except CheckpointException as exc:  # collective: every rank raises the same
            raise CheckpointError(
                f"writing the DCP shards of {folder} failed ({describe_failure(exc)}); nothing of this save was "
                "committed and `last` still names the newest complete checkpoint: free space on that disk, or pick "
                "another --output_dir, then resume"
            ) from None
        return
    _background_group(folder.name)  # every rank creates the groups in the same order, in this thread
    save.jobs.append((state, folder))


def _start_background_writes(save: _Save) -> None:
    """In the save's thread: DCP async saves, each staging (copying) the state in its own
    thread, then writing from the copy, with collectives on its own group."""
    for state, folder in save.jobs:
        stager = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False, use_async_staging=True, use_non_blocking_copy=False))
        save.stagers.append(stager)
        response = async_save(state, storage_writer=WritebackFileSystemWriter(folder), process_group=_background_groups[folder.name], async_stager=stager)
        save.uploads.append(getattr(response, "upload_completion", response))
        save.staged.append(getattr(response, "staging_completion", None))
    save.jobs.clear()  # the thread keeps no reference to the live state


def _record(save: _Save, path: Path, digest: FileDigest | None) -> None:
    if digest is not None:  # the main rank's
        save.record(path, digest)


def _save_model(save: _Save, model: nn.Module, adapter: bool) -> None:
    """Model tensors; a PEFT run (`adapter`) saves only its trainable tensors, in every format."""
    if save.fmt in _DCP_FORMATS:
        _write_dcp(save, dict(local_model_state(model, trainable_only=adapter)), save.files.model_dcp)
    if save.fmt == "dcp":
        return
    path = save.files.pretrained / (ADAPTER_WEIGHTS if adapter else "model.safetensors")
    if is_sharded(model):  # gathered tensor by tensor, each written while the next is gathered
        _record(save, path, write_gathered(path, local_model_state(model, trainable_only=adapter), {"format": "pt"}, f"writing {path}"))
        return
    full = full_model_state(model, trainable_only=adapter)  # plain and DDP: the live tensors, nothing to gather
    run_on_main(lambda: save.record(path, write_tensor_dict(path, full, {"format": "pt"})), f"writing {path}")


def _save_optimizer(save: _Save, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """A sharded optimizer is always written as DCP shards, whatever the format (the guide's
    rule): gathering it into one file would cost the main rank the whole state's memory and
    time. Only a model that is not sharded writes optimizer_state.safetensors."""
    if save.fmt in _DCP_FORMATS or is_sharded(model):
        tensors, extra = split_optimizer_state(local_optimizer_state(model, optimizer))
        _write_dcp(save, dict(tensors), save.files.optimizer_dcp)
        _main_rank_block(save, lambda: save_json(save.files.optimizer_groups, extra), f"writing {save.files.optimizer_groups}")
        return
    full = full_optimizer_state(model, optimizer)

    def write() -> None:
        tensors, extra = split_optimizer_state(full)
        save.record(save.files.optimizer, write_tensor_dict(save.files.optimizer, tensors))
        save_json(save.files.optimizer_groups, extra)

    run_on_main(write, f"writing {save.files.optimizer}")


def _main_rank_block(save: _Save, block: Callable[[], None], what: str) -> None:
    """`run_on_main` now, or (a background save) in its thread, so the loop does not wait for
    small files and their fsyncs."""
    if save.background:
        save.small_files.append((block, what))
    else:
        run_on_main(block, what)


def _write_single_files(save: _Save, request: SaveRequest, rng: list[dict[str, torch.Tensor]] | None) -> Callable[[], None]:
    def write() -> None:
        files = save.files
        save_json(files.train_config, to_dict(request.train_config))
        save_training_step(files.training_step, dataclasses.replace(request.training_step, checkpoint_format=save.fmt))
        save_json(files.scheduler, request.scheduler_state)
        if request.scaler_state is not None:
            save_json(files.scaler, request.scaler_state)
        assert rng is not None  # gathered on the main rank
        write_tensor_dict(files.rng, encode_all_ranks(rng), {"world_size": str(len(rng))})
        request.write_pretrained(files.pretrained)

    return write


def _point_last(checkpoints_dir: Path, name: str) -> None:
    link = checkpoints_dir / LAST
    if link.exists() and not link.is_symlink():
        raise RuntimeError(f"{link} exists and is not a symlink; move it away so `last` can point to the newest checkpoint")
    tmp_link = checkpoints_dir / f".last-{secrets.token_hex(4)}"
    os.symlink(name, tmp_link)
    os.replace(tmp_link, link)
    _fsync(checkpoints_dir)


def _prune(checkpoints_dir: Path, keep: int) -> None:
    if keep <= 0:
        return
    link = checkpoints_dir / LAST
    protected = os.readlink(link) if link.is_symlink() else None
    for old in list_step_dirs(checkpoints_dir)[:-keep]:
        if old.name != protected:
            shutil.rmtree(old)


def _commit(save: _Save, group: dist.ProcessGroup | None = None) -> None:
    write_checksums(save.tmp, save.digests, group)

    def commit() -> None:
        _fsync_tree(save.tmp)
        pause_point("before_rename", save.checkpoints_dir)
        replaced = save.checkpoints_dir / f"{TEMP_PREFIX}replaced-{save.final.name}-{secrets.token_hex(4)}"
        if save.final.exists():
            os.rename(save.final, replaced)
        os.rename(save.tmp, save.final)
        _fsync(save.checkpoints_dir)
        pause_point("before_last", save.checkpoints_dir)
        _point_last(save.checkpoints_dir, save.final.name)
        shutil.rmtree(replaced, ignore_errors=True)
        _prune(save.checkpoints_dir, save.keep)

    run_on_main(commit, f"committing {save.final}", group)


def save_checkpoint(checkpoints_dir: Path, step: int, request: SaveRequest) -> Path:
    """Collective: write `checkpoints_dir/<step:06d>/` and point `last` at it; return it.

    Every rank calls this at the same point of the loop. With `checkpoint_async` and a
    DCP format it returns once the writes are under way: call `wait_for_staging()` before
    the next optimizer step; the folder appears once the background commit is done, which
    `wait_for_pending_save()` (the next save calls it) waits for. Python's garbage collector
    is paused until it returns (`collector_paused`).
    """
    with collector_paused():
        return _save_checkpoint(checkpoints_dir, step, request)


def _save_checkpoint(checkpoints_dir: Path, step: int, request: SaveRequest) -> Path:
    wait_for_pending_save()
    rng = gather_values(capture_rng_state())
    save = _begin(Path(checkpoints_dir), step, request)
    pause_point("before_shards", save.checkpoints_dir)
    _save_model(save, request.model, adapter=request.train_config.peft.method_type is not None)
    pause_point("between_shards", save.checkpoints_dir)
    _save_optimizer(save, request.model, request.optimizer)
    _main_rank_block(save, _write_single_files(save, request, rng), f"writing the files of {save.tmp}")
    if save.background:
        global _pending
        group = _background_group("commit") if dist.is_initialized() else None  # created by every rank, here
        save.committer = threading.Thread(target=_save_in_background, args=(save, group), name="lr-checkpoint-save", daemon=True)
        save.committer.start()
        _pending = save
    else:
        _commit(save)
    return save.final


def _finish_uploads(save: _Save) -> str | None:
    error: str | None = None
    for upload in save.uploads:
        try:
            upload.result()
        except (Exception, CheckpointException) as exc:  # reported on the main rank, raised on every rank
            error = describe_failure(exc)
    for stager in save.stagers:
        stager.close()
    return error


def _save_in_background(save: _Save, group: dist.ProcessGroup | None) -> None:
    """The thread of a background save, on every rank: start the DCP writes (their staging
    copies the live state: `wait_for_staging` waits for it), wait for them, write the small
    files on the main rank, then checksums, fsync, rename and `last`. Its
    collectives use its own groups, never the training's, which the loop keeps using
    meanwhile. A failure is kept for `wait_for_pending_save`, the same CheckpointError on
    every rank."""
    try:
        error: str | None = None
        try:
            _start_background_writes(save)
        except (Exception, CheckpointException) as exc:
            error = describe_failure(exc)
        finally:
            save.staging_known.set()
        finished = _finish_uploads(save)  # waits for whatever started, even after a failure
        errors = gather_values(error or finished, group)

        def check() -> None:
            failed = [f"rank {r}: {e}" for r, e in enumerate(errors or []) if e]
            if failed:
                raise CheckpointError(
                    "background checkpoint write failed (" + "; ".join(failed) + f"); {save.tmp} was not committed and "
                    "`last` still names the newest complete checkpoint"
                )

        run_on_main(check, f"background save of {save.final}", group)
        for block, what in save.small_files:
            run_on_main(block, what, group)
        _commit(save, group)
    except BaseException as exc:
        save.failure = exc


def wait_for_staging() -> None:
    """Before the optimizer step that follows a background save, on every rank: wait until the
    background copy of the model and optimizer state is done (it reads the live tensors; the
    update must not change them first). The writes and the commit go on. No-op otherwise;
    not collective. A staging failure is left to the commit, which reports it on every rank."""
    save = _pending
    if save is None:
        return
    save.staging_known.wait()
    for staged in save.staged:
        if staged is None:
            continue
        try:
            staged.result()
        except (Exception, CheckpointException):
            pass


def pending_save() -> Path | None:
    """The step folder a background save is writing (not yet committed), else None."""
    return None if _pending is None else _pending.final


def wait_for_pending_save() -> Path | None:
    """Collective when a background save is pending: wait until it is committed (or raise its
    failure, the same CheckpointError on every rank) and return its step folder. Call it
    before exiting; every save calls it first. No-op (None) otherwise.
    """
    global _pending
    save, _pending = _pending, None
    if save is None:
        return None
    assert save.committer is not None
    save.committer.join()
    if save.failure is not None:
        raise save.failure
    return save.final
