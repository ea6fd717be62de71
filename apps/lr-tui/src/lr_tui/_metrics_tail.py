"""Tail a growing `metrics.jsonl` without re-reading it.

`JsonlTail.read()` returns the complete lines appended since the last call (blank ones
too with `skip_blank=False`, as the log view needs to keep line numbers). It keeps the
byte offset and the partial last line (the engine may be mid-write) for the next call, and
starts over from byte 0 when the file shrinks or is replaced (a new run in the same folder),
telling the caller so it can drop what it had. `MetricsTail` turns those lines into
`MetricsRecord`s, strictly, keeping the problems of bad lines instead of raising;
`MetricsTails` keeps one per run of a changing set (the runs marked for comparison).
`last_record` reads only a file's end for its newest valid record (the run list's ETA).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lr_config import ConfigError, MetricsRecord, parse_metrics_line
from lr_config.layout import METRICS

__all__ = ["JsonlTail", "MetricsRead", "MetricsTail", "MetricsTails", "last_record"]


class JsonlTail:
    """Complete new lines of one file, read incrementally."""

    def __init__(self, path: Path, *, skip_blank: bool = True) -> None:
        self.path = Path(path)
        self.skip_blank = skip_blank
        self.offset = 0
        self.partial = b""
        self._inode: int | None = None

    def read(self) -> tuple[list[bytes], bool]:
        """(new complete lines, whether the file restarted since the last read)."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            restarted = self.offset > 0 or bool(self.partial)
            self._reset(None)
            return [], restarted
        restarted = stat.st_size < self.offset or (self._inode is not None and stat.st_ino != self._inode)
        if restarted:
            self._reset(stat.st_ino)
        self._inode = stat.st_ino
        if stat.st_size == self.offset:
            return [], restarted
        with self.path.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read(stat.st_size - self.offset)
        self.offset += len(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        return [line for line in lines if line.strip() or not self.skip_blank], restarted

    def _reset(self, inode: int | None) -> None:
        self.offset = 0
        self.partial = b""
        self._inode = inode


@dataclass
class MetricsRead:
    records: list[MetricsRecord] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    restarted: bool = False


class MetricsTail:
    """`MetricsRecord`s appended to a metrics.jsonl since the last read."""

    def __init__(self, path: Path) -> None:
        self.lines = JsonlTail(path)
        self.line_number = 0

    def read(self) -> MetricsRead:
        raw, restarted = self.lines.read()
        out = MetricsRead(restarted=restarted)
        if restarted:
            self.line_number = 0
        for line in raw:
            self.line_number += 1
            try:
                out.records.append(self._parse(line))
            except ConfigError as exc:
                out.problems.append(str(exc))
        return out

    def _parse(self, line: bytes) -> MetricsRecord:
        return parse_metrics_line(line, f"{self.lines.path.name}:{self.line_number}")


class MetricsTails:
    """A `MetricsTail` per key (any hashable: the Monitor's is a run folder with the number of its marking)."""

    def __init__(self) -> None:
        self.tails: dict[Hashable, MetricsTail] = {}

    def read(self, runs: Sequence[tuple[Hashable, Path]]) -> dict[Hashable, MetricsRead]:
        """The `metrics.jsonl` of each (key, run folder) read since the last call: every key's
        first read, and afterwards those with news. Keys no longer given are forgotten."""
        reads: dict[Hashable, MetricsRead] = {}
        for key, run_dir in runs:
            tail = self.tails.get(key)
            new = tail is None
            if tail is None:
                tail = self.tails[key] = MetricsTail(run_dir / METRICS)
            read = tail.read()
            if new or read.records or read.restarted or read.problems:
                reads[key] = read
        kept = {key for key, _ in runs}
        self.tails = {key: tail for key, tail in self.tails.items() if key in kept}
        return reads


def last_record(path: Path, *, tail_bytes: int = 65536) -> MetricsRecord | None:
    """The newest complete, valid record of a metrics.jsonl, from its last `tail_bytes`; None
    when there is none (no file, nothing complete yet, or only bad lines there)."""
    try:
        with Path(path).open("rb") as f:
            size = f.seek(0, 2)
            start = max(0, size - tail_bytes)
            f.seek(start)
            chunk = f.read(size - start)
    except OSError:
        return None
    lines = chunk.split(b"\n")
    lines.pop()  # after the last newline: empty, or a line the engine is still writing
    if start > 0 and lines:
        lines.pop(0)  # cut by the window
    for line in reversed(lines):
        try:
            return parse_metrics_line(line, str(path))
        except ConfigError:
            continue
    return None
