"""The small JSON files of a checkpoint, read with errors that name the file (no torch).

`optimizer_param_groups.json` holds what DCP would otherwise pickle: the optimizer's
param groups (hyper-parameters and the FQNs of their parameters) and any non-tensor
per-parameter state, under a schema `version`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ._errors import CheckpointError

__all__ = ["OPTIMIZER_JSON_VERSION", "read_json_object", "read_optimizer_json"]

OPTIMIZER_JSON_VERSION = 1


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object from `path`, or a CheckpointError naming the file."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found; the checkpoint is incomplete") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc}); the file is damaged") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object; the file is damaged")
    return data


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
