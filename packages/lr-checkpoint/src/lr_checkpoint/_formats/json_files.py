"""The small JSON files of a checkpoint, read with errors that name the file (no torch).

`optimizer_param_groups.json` holds what DCP would otherwise pickle: the optimizer's
param groups (hyper-parameters and the FQNs of their parameters) and any non-tensor
per-parameter state, under a schema `version`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lr_config import CheckpointError, read_json_object as json_object

__all__ = ["OPTIMIZER_JSON_VERSION", "read_json_object", "read_optimizer_json"]

OPTIMIZER_JSON_VERSION = 1


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object from a checkpoint's `path`, or a CheckpointError naming the file."""
    return json_object(path, error=CheckpointError, missing=": file not found; the checkpoint is incomplete", damaged="; the file is damaged")


def read_optimizer_json(path: Path) -> dict[str, Any]:
    """`optimizer_param_groups.json`, checked for its schema."""
    data = read_json_object(path)
    groups, other = data.get("param_groups"), data.get("non_tensor_state")
    ok = (
        data.get("version") == OPTIMIZER_JSON_VERSION
        and isinstance(groups, list)
        and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups)
        and isinstance(other, dict)
    )
    if not ok or set(data) != {"version", "param_groups", "non_tensor_state"}:
        raise CheckpointError(f"{path}: not an lr optimizer param-groups file (version {OPTIMIZER_JSON_VERSION}); the file is damaged")
    return data
