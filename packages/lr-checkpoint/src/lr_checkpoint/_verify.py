"""Is a checkpoint whole? Every file present, parseable, complete and readable.

`verify_checkpoint(path)` returns the list of problems ([] when whole); it never raises
for a damaged checkpoint. Checks, in order: the JSON files parse against their schema;
each safetensors file's header matches its length and every tensor reads back; each DCP
folder's `.metadata` passes the restricted parser (before anything unpickles it), names
only shard files that exist and are long enough, and every tensor loads; the files the
saved format promises are there. Reading every tensor makes this as slow as a load.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from lr_config import CheckpointError, ConfigError, TrainingStep, load_train_config
from safetensors import safe_open
from lr_config.layout import StepFiles, resolve_step_dir
from lr_config.st_format import read_header

from ._formats.dcp.metadata import read_whole_dcp_metadata
from ._formats.dcp.read import dcp_batches, load_dcp_batch, load_dcp_tensor
from ._formats.json_files import read_json_object, read_optimizer_json
from ._io.checksums import checksum_problems
from ._resume import read_training_step

__all__ = ["verify_checkpoint"]


def _collect(problems: list[str], check: Callable[[], object]) -> None:
    try:
        check()
    except ConfigError as exc:
        problems.extend(exc.problems if len(exc.problems) > 1 else [str(exc)])


def _read_safetensors(path: Path) -> list[str]:
    problems: list[str] = []
    _collect(problems, lambda: read_header(path))
    if problems:
        return problems
    try:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                try:
                    f.get_tensor(key)
                except Exception as exc:  # safetensors error types vary by version
                    problems.append(f"{path}: tensor {key!r} unreadable ({exc})")
    except Exception as exc:
        problems.append(f"{path}: safetensors cannot open it ({exc})")
    return problems


def _read_dcp(folder: Path) -> list[str]:
    problems: list[str] = []
    meta = None

    def parse() -> None:
        nonlocal meta
        meta = read_whole_dcp_metadata(folder)

    _collect(problems, parse)
    if meta is None:
        return problems
    for batch in dcp_batches(meta, sorted(meta.tensors)):
        try:
            load_dcp_batch(meta, batch)
        except CheckpointError:  # name each unreadable tensor of the batch
            for key in batch:
                try:
                    load_dcp_tensor(folder, key, meta.tensors[key])
                except CheckpointError as exc:
                    problems.append(f"{folder}: tensor {key!r} unreadable ({exc.problems[0]})")
    return problems


def _required(files: StepFiles, fmt: str | None) -> list[Path]:
    """Files the saved format promises (convert may add model.safetensors, never remove it)."""
    paths = [files.config, files.train_config, files.training_step, files.rng, files.scheduler, files.optimizer_groups]
    if fmt in ("safetensors", "safetensors_dcp"):
        paths.append(files.model)
    # a sharded run's optimizer is DCP in every format (a `safetensors` one saved before lr wrote it so
    # holds the gathered file instead)
    sharded_optimizer = fmt != "safetensors" or files.optimizer_dcp.exists()
    paths.append(files.optimizer_dcp if sharded_optimizer else files.optimizer)
    return paths


def _check_json_files(files: StepFiles, problems: list[str]) -> TrainingStep | None:
    step: list[TrainingStep] = []
    _collect(problems, lambda: step.append(read_training_step(files.root)))
    _collect(problems, lambda: load_train_config(files.train_config))
    for path in (files.config, files.scheduler):
        _collect(problems, lambda p=path: read_json_object(p))  # type: ignore[misc]
    if files.scaler.exists() or (step and step[0].precision == "fp16"):
        _collect(problems, lambda: read_json_object(files.scaler))
    if files.optimizer_groups.exists():
        _collect(problems, lambda: read_optimizer_json(files.optimizer_groups))
    return step[0] if step else None


def verify_checkpoint(path: Path) -> list[str]:
    """Problems that make the checkpoint at `path` unusable; [] when it is whole."""
    try:
        files = StepFiles(resolve_step_dir(path))
    except ConfigError as exc:
        return [str(exc)]
    problems: list[str] = []
    step = _check_json_files(files, problems)
    fmt = step.checkpoint_format if step else None
    missing = [p for p in _required(files, fmt) if not p.exists()]
    if fmt == "dcp" and not (files.model_dcp.exists() or files.model.exists()):
        missing.append(files.model_dcp)
    problems.extend(f"{p}: missing; the checkpoint is incomplete" for p in missing if not any(str(p) in q for q in problems))
    for source in (files.model, files.optimizer, files.rng):
        if source.is_file():
            problems.extend(_read_safetensors(source))
    for folder in (files.model_dcp, files.optimizer_dcp):
        if folder.exists():
            problems.extend(_read_dcp(folder))
    reported = {Path(q.split(": ", 1)[0]) for q in problems}
    damaged = [p for p in files.root.rglob("*") if p in reported or p.parent in reported]
    problems.extend(checksum_problems(files.root, skip=damaged))
    return problems
