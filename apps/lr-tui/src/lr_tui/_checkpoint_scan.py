"""The checkpoints of a run folder, from files only (no torch).

`scan_checkpoints(run_dir)` lists `<run>/checkpoints/<step>` folders, skipping hidden and
temporary ones (`.tmp-*`, written before the atomic rename) and the `last` link, with what
`training_step.json` says (format, topology, precision) and what the files show (full
weights, DCP shards, size). `checkpoint_details(step_dir)` lists the files and reads the
tensor count and bytes of each safetensors file from its header.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from lr_config import ConfigError, TrainingStep, load_training_step
from lr_config.layout import ADAPTER_WEIGHTS, CHECKPOINTS, LAST, MODEL_WEIGHTS, StepFiles

from ._safetensors_header import TensorSummary, summarize_tensors

__all__ = ["CheckpointDetails", "CheckpointRow", "checkpoint_details", "read_training_step", "scan_checkpoints"]

WEIGHT_FILES = {MODEL_WEIGHTS: "model", ADAPTER_WEIGHTS: "adapter"}


@dataclass(frozen=True)
class CheckpointRow:
    name: str
    path: Path
    step: int | None
    format: str
    topology: str
    precision: str
    size: int
    weights: str
    """'model', 'adapter' or '' (the full-weights safetensors present)."""
    dcp: bool
    is_last: bool
    problem: str = ""


@dataclass
class CheckpointDetails:
    path: Path
    files: list[tuple[str, int]] = field(default_factory=list)
    tensors: dict[str, TensorSummary] = field(default_factory=dict)
    training_step: TrainingStep | None = None
    problems: list[str] = field(default_factory=list)


def _tree_size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.lstat(os.path.join(root, name)).st_size for name in files)
    return total


def _weights(pretrained: Path) -> str:
    for name, kind in WEIGHT_FILES.items():
        if (pretrained / name).is_file():
            return kind
    return ""


def read_training_step(step_dir: Path) -> tuple[TrainingStep | None, str]:
    path = StepFiles(step_dir).training_step
    if not path.exists():
        return None, "no training_step.json"
    try:
        return load_training_step(path), ""
    except ConfigError as exc:
        return None, str(exc)


def _inferred_format(weights: str, dcp: bool) -> str:
    if dcp:
        return "safetensors_dcp" if weights else "dcp"
    return "safetensors" if weights else "?"


def _last_target(checkpoints: Path) -> Path | None:
    link = checkpoints / LAST
    return link.resolve() if link.is_symlink() and link.exists() else None


def _row(step_dir: Path, last: Path | None) -> CheckpointRow:
    files = StepFiles(step_dir)
    weights = _weights(files.pretrained)
    dcp = files.model_dcp.is_dir()
    ts, problem = read_training_step(step_dir)
    topo = ts.topology if ts else None
    return CheckpointRow(
        name=step_dir.name,
        path=step_dir,
        step=int(step_dir.name) if step_dir.name.isdigit() else (ts.step if ts else None),
        format=ts.checkpoint_format if ts else _inferred_format(weights, dcp),
        topology=f"{topo.layout} {topo.dp_replicate}x{topo.dp_shard}" if topo else "?",
        precision=ts.precision if ts else "?",
        size=_tree_size(step_dir),
        weights=weights,
        dcp=dcp,
        is_last=last is not None and step_dir.resolve() == last,
        problem=problem,
    )


def scan_checkpoints(run_dir: Path) -> list[CheckpointRow]:
    """Every complete step folder under `<run_dir>/checkpoints`, oldest step first."""
    checkpoints = Path(run_dir) / CHECKPOINTS
    if not checkpoints.is_dir():
        return []
    last = _last_target(checkpoints)
    dirs = [
        p
        for p in checkpoints.iterdir()
        if p.is_dir() and not p.is_symlink() and not p.name.startswith(".") and not p.name.startswith("tmp")
    ]
    rows = [_row(p, last) for p in dirs]
    return sorted(rows, key=lambda r: (r.step is None, r.step or 0, r.name))


def checkpoint_details(step_dir: Path) -> CheckpointDetails:
    """Files with sizes, and the tensors of each safetensors file (headers only)."""
    details = CheckpointDetails(path=Path(step_dir))
    for root, dirs, files in os.walk(step_dir):
        dirs.sort()
        for name in sorted(files):
            path = Path(root) / name
            rel = path.relative_to(step_dir).as_posix()
            details.files.append((rel, path.lstat().st_size))
            if name.endswith(".safetensors"):
                try:
                    details.tensors[rel] = summarize_tensors(path)
                except ConfigError as exc:
                    details.problems.append(f"{rel}: {exc}")
    details.training_step, problem = read_training_step(Path(step_dir))
    if problem:
        details.problems.append(problem)
    return details
