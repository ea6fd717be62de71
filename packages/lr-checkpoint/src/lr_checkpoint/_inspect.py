"""What a checkpoint holds, from headers alone (no tensor data, no torch import).

`inspect_checkpoint(path)` returns plain JSON-able data: step, format, topology,
precision, every file with its size, and for each weight or optimizer source its tensor
count and bytes (safetensors headers, DCP metadata read by the restricted parser).
A part that cannot be read is reported in `problems` rather than raised; only a path
that is not a checkpoint at all raises `CheckpointError`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lr_config import CheckpointError, ConfigError
from lr_config.layout import StepFiles, resolve_step_dir
from lr_config.st_format import read_header

from ._formats.dcp.metadata import read_dcp_metadata
from ._resume import read_training_step

__all__ = ["inspect_checkpoint", "tensor_sources"]


def tensor_sources(files: StepFiles) -> dict[str, list[Path]]:
    """Existing model and optimizer sources of a step folder, by part."""
    model = [p for p in (files.model, files.model_dcp) if p.exists()]
    optimizer = [p for p in (files.optimizer, files.optimizer_dcp) if p.exists()]
    return {"model": model, "optimizer": optimizer}


def _summary(files: StepFiles, source: Path) -> dict[str, Any]:
    rel = str(source.relative_to(files.root))
    if source.is_dir():
        meta = read_dcp_metadata(source)
        return {"path": rel, "kind": "dcp", "tensors": len(meta.tensors), "bytes": meta.total_bytes, "shard_files": len(meta.shard_files())}
    header = read_header(source)
    return {"path": rel, "kind": "safetensors", "tensors": len(header.tensors), "bytes": header.data_bytes}


def _file_list(root: Path) -> list[dict[str, Any]]:
    return [
        {"path": str(p.relative_to(root)), "bytes": p.stat().st_size}
        for p in sorted(root.rglob("*"))
        if p.is_file()
    ]


def _step_fields(files: StepFiles, problems: list[str]) -> dict[str, Any]:
    try:
        ts = read_training_step(files.root)
    except ConfigError as exc:
        problems.append(str(exc))
        return {"step": None, "format": None, "precision": None, "topology": None}
    topology = {"layout": ts.topology.layout, "world_size": ts.topology.world_size, "dp_replicate": ts.topology.dp_replicate, "dp_shard": ts.topology.dp_shard, "nnodes": ts.topology.nnodes}
    return {"step": ts.step, "format": ts.checkpoint_format, "precision": ts.precision, "topology": topology, "samples_seen": ts.samples_seen, "epoch": ts.epoch}


def inspect_checkpoint(path: Path) -> dict[str, Any]:
    """Headers-only description of the checkpoint at `path` (see `resolve_step_dir`)."""
    files = StepFiles(resolve_step_dir(path))
    problems: list[str] = []
    report: dict[str, Any] = {"path": str(files.root), **_step_fields(files, problems)}
    for part, sources in tensor_sources(files).items():
        report[part] = []
        for source in sources:
            try:
                report[part].append(_summary(files, source))
            except CheckpointError as exc:
                problems.append(str(exc))
    report["files"] = _file_list(files.root)
    report["total_bytes"] = sum(f["bytes"] for f in report["files"])
    report["problems"] = problems
    return report
