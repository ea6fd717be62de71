"""Reading a run's `metrics.jsonl` in tests: the records, and the loss and pre-clip
`grad_norm` of every logged step (the values the equivalence tests compare)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["grad_norms", "losses", "records"]


def records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def losses(run: Path) -> list[float]:
    return [r["loss"] for r in records(run)]


def grad_norms(run: Path) -> list[float]:
    return [r["grad_norm"] for r in records(run)]
