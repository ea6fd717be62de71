"""The runs found on disk, for the Monitor's run list: no Textual here, only files and /proc.

`RunFinder.read(extra)` finds the run folders (a folder holding `run.json` or
`train_config.json`) under its roots, `outputs/train` by default (where lr-engine writes a run
started without `--output_dir`: `outputs/train/<date>/<time>_<job>`) and any `--runs=DIR`,
down to three levels and never inside a run, plus the `extra` folders (the runs opened in this
session). For each it reads `run.json` (status, step, world size), `train_config.json`
(policy type, dp degrees; else the one of `checkpoints/last`) and the last record of `metrics.jsonl` (its end only), each again
only when its mtime or size changed; a run that says "running" is "stale" when its pid is
gone on this host (`_run_info`'s check, made every time: a process ends without touching a
file), or, on another host, when its run.json has not been updated for 30 minutes
(`_run_info.STALE_AFTER_S`; lr-engine rewrites it at every logged step). Newest first: by run.json's `started`, else the folder's mtime.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from lr_config import ConfigError, RunStatus, TrainConfig, load_run_status, load_train_config, resolve_topology
from lr_config.layout import CHECKPOINTS, METRICS, RUN_STATUS, TRAIN_CONFIG, TRAIN_OUTPUTS, last_train_config

from ._metrics_tail import last_record
from ._run_info import stale_reason
from ._series import format_value

__all__ = ["DEFAULT_RUN_ROOTS", "RUNS_ROOT", "RunFinder", "RunInfo", "layout_cell", "name_under"]

RUNS_ROOT = TRAIN_OUTPUTS
"""lr-engine's folder for runs started without --output_dir (relative to the working folder)."""

DEFAULT_RUN_ROOTS: tuple[Path, ...] = (RUNS_ROOT,)
"""What `LrApp` lists when it is given no roots (the tests set it to none)."""

_DEPTH = 3
_MARKERS = (RUN_STATUS, TRAIN_CONFIG)


@dataclass(frozen=True)
class RunInfo:
    path: Path
    name: str
    """The path relative to the root it was found under, else as given."""
    status: str = "no run.json yet"
    """running, finished, failed, stopped, stale, 'no run.json yet' or 'unreadable run.json'."""
    step: int = 0
    steps: int = 0
    policy: str = ""
    layout: str = ""
    loss: str = ""
    started: float = 0.0
    """The sort key: run.json's start (seconds since the epoch), else the folder's mtime."""

    @property
    def step_cell(self) -> str:
        return f"{self.step}/{self.steps}" if self.steps else (str(self.step) if self.step else "")


def layout_cell(cfg: TrainConfig | None, world_size: int) -> str:
    """`single`, `DDP 4`, `FSDP2 8`, `HSDP 2x4`: the run's topology in a few columns."""
    if world_size <= 1:
        return "single"
    if cfg is None:
        return f"world {world_size}"
    try:
        topo = resolve_topology(cfg.parallelism, world_size)
    except ConfigError:
        return f"world {world_size}"
    if topo.layout == "hsdp":
        return f"HSDP {topo.dp_replicate}x{topo.dp_shard}"
    return f"{'DDP' if topo.layout == 'ddp' else 'FSDP2'} {world_size}"


def _started(status: RunStatus | None, folder: Path) -> float:
    if status is not None and status.started:
        try:
            return datetime.fromisoformat(status.started).timestamp()
        except ValueError:
            pass
    try:
        return folder.stat().st_mtime
    except OSError:
        return 0.0


class _FileCache:
    """One parsed value per file, parsed again only when the file's mtime, size or inode changed
    (some file systems keep whole seconds: a file rewritten within one keeps its mtime)."""

    def __init__(self) -> None:
        self._seen: dict[Path, tuple[tuple[int, int, int], Any]] = {}

    def get(self, path: Path, parse: Callable[[Path], Any]) -> Any:
        try:
            st = path.stat()
        except OSError:
            self._seen.pop(path, None)
            return None
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        seen = self._seen.get(path)
        if seen is not None and seen[0] == stamp:
            return seen[1]
        value = parse(path)
        self._seen[path] = (stamp, value)
        return value

    def forget_except(self, keep: set[Path]) -> None:
        for path in [p for p in self._seen if p not in keep]:
            del self._seen[path]


def _status(path: Path) -> RunStatus | ConfigError:
    try:
        return load_run_status(path)
    except ConfigError as exc:
        return exc
    except OSError as exc:
        return ConfigError(str(exc))


def _config(path: Path) -> TrainConfig | None:
    try:
        return load_train_config(path)
    except (ConfigError, OSError):
        return None


def _loss(path: Path) -> str:
    record = last_record(path, tail_bytes=16384)
    return format_value(record.loss) if record is not None else ""


class RunFinder:
    def __init__(self, roots: Sequence[Path]) -> None:
        self.roots = [Path(r) for r in roots]
        self._files = _FileCache()

    def find(self) -> list[tuple[Path, str]]:
        """(run folder, its name relative to the root) under every root, roots in order."""
        found: list[tuple[Path, str]] = []
        for root in self.roots:
            level = [root]
            for depth in range(_DEPTH + 1):
                below: list[Path] = []
                for folder in level:
                    if any((folder / marker).is_file() for marker in _MARKERS):
                        found.append((folder, str(folder.relative_to(root)) if folder != root else str(root)))
                    elif depth < _DEPTH:
                        below += _subfolders(folder)
                level = below
        return found

    def read(self, extra: Sequence[Path] = ()) -> list[RunInfo]:
        """Every run under the roots and in `extra` (once each: `extra` names win), newest first."""
        runs: dict[Path, tuple[Path, str]] = {}
        for path in extra:
            runs.setdefault(_identity(path), (path, name_under(path, self.roots)))
        for path, name in self.find():
            runs.setdefault(_identity(path), (path, name))
        infos = [self._info(path, name) for path, name in runs.values()]
        read = (RUN_STATUS, TRAIN_CONFIG, METRICS)
        self._files.forget_except({p for path, _ in runs.values() for p in (*(path / f for f in read), last_train_config(path / CHECKPOINTS))})
        return sorted(infos, key=lambda i: (i.started, i.name), reverse=True)

    def _info(self, path: Path, name: str) -> RunInfo:
        status = self._files.get(path / RUN_STATUS, _status)
        cfg = self._files.get(path / TRAIN_CONFIG, _config) or self._files.get(last_train_config(path / CHECKPOINTS), _config)
        loss = self._files.get(path / METRICS, _loss) or ""
        policy = cfg.policy.type_name if cfg is not None else ""
        if isinstance(status, RunStatus):
            state: str = "stale" if stale_reason(status) else status.status
            return RunInfo(path, name, state, status.step, status.steps, policy, layout_cell(cfg, status.world_size), loss, _started(status, path))
        state = "unreadable run.json" if isinstance(status, ConfigError) else "no run.json yet"
        return RunInfo(path, name, state, policy=policy, loss=loss, started=_started(None, path))


def _subfolders(folder: Path) -> list[Path]:
    try:
        with os.scandir(folder) as entries:
            return sorted(Path(e.path) for e in entries if not e.name.startswith(".") and e.is_dir())
    except OSError:
        return []


def _identity(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return Path(os.path.abspath(path))


def name_under(path: Path, roots: Sequence[Path]) -> str:
    """`path` relative to the first root it is under, else as given."""
    for root in roots:
        try:
            relative = path.relative_to(root)
        except ValueError:
            continue
        if relative.parts:
            return str(relative)
    return str(path)
