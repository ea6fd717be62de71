"""One poll of a run folder: its status, its processes, and what its log says.

`read_run_state(output_dir, launched)` combines `run.json` (`summarize_run`), the launcher
recorded in `logs/launch.json` and the processes alive now (`run_control.liveness`), and,
for a launch this TUI started, its exit code: a launcher that exited before the engine
wrote run.json (a bad flag, a failed rendezvous) shows as such instead of "running".

`LogWatch` reads a run's combined log incrementally (`newest_log`: `logs/launch.log` for
launches from the TUI): the complete new lines, blank ones included so line numbers match
the file, and the events `EventParser` finds in them. Called from the Monitor's worker
thread; reads files and /proc only.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from lr_config import ConfigError, RunStatus, load_run_status
from lr_config.layout import RUN_STATUS

from ._events import Event, EventLog, EventParser
from ._metrics_tail import JsonlTail
from ._procs import Proc
from ._run_control import Liveness, liveness, read_launch_record
from ._run_info import RunSummary, newest_log, summarize_run

__all__ = ["LogRead", "LogWatch", "RunState", "read_run_state", "run_liveness"]


@dataclass(frozen=True)
class RunState:
    summary: RunSummary
    live: Liveness

    @property
    def status_cell(self) -> str:
        """The state, short: `stale (process gone)` is `stale` in the run list."""
        return "stale" if self.summary.state.startswith("stale") else self.summary.state

    @property
    def step_cell(self) -> str:
        s = self.summary
        return f"{s.step}/{s.steps}" if s.steps else (str(s.step) if s.step else "")


def _run_status(output_dir: Path) -> RunStatus | None:
    try:
        return load_run_status(Path(output_dir) / RUN_STATUS)
    except (ConfigError, OSError):
        return None


def run_liveness(output_dir: Path, procs: list[Proc] | None = None) -> Liveness:
    """The run's processes alive now (the recorded launcher and below it, else run.json's pid)."""
    return liveness(read_launch_record(output_dir), _run_status(output_dir), procs)


def read_run_state(output_dir: Path, launched: subprocess.Popen[bytes] | None, procs: list[Proc]) -> RunState:
    summary = summarize_run(output_dir)
    code = launched.poll() if launched is not None else None
    if code is not None and summary.state in ("no run.json yet", "running"):
        summary = RunSummary(state=f"launch exited with code {code}", step=summary.step, steps=summary.steps)
    return RunState(summary=summary, live=run_liveness(output_dir, procs))


@dataclass
class LogRead:
    path: Path | None = None
    lines: list[str] = field(default_factory=list)
    restarted: bool = False
    """The log started over (another file, or shrunk): drop what was shown."""
    events: list[Event] | None = None
    """Every event so far, when they changed in this read; None when unchanged."""


class LogWatch:
    """New lines and events of one run's combined log."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = Path(output_dir)
        self.path: Path | None = None
        self._tail: JsonlTail | None = None
        self._parser = EventParser()
        self._events = EventLog()

    def _start_over(self, path: Path | None) -> None:
        self.path = path
        self._tail = JsonlTail(path, skip_blank=False) if path is not None else None
        self._parser = EventParser()
        self._events = EventLog()

    def read(self) -> LogRead:
        path = newest_log(self.output_dir)
        restarted = path != self.path
        if restarted:
            self._start_over(path)
        if self._tail is None:
            return LogRead(path=None, restarted=restarted, events=[] if restarted else None)
        raw, shrunk = self._tail.read()
        if shrunk:  # the tail read the new content from byte 0: parse it afresh
            self._parser, self._events = EventParser(), EventLog()
            restarted = True
        lines = [line.decode("utf-8", errors="replace").rstrip("\r") for line in raw]
        changed = False
        for line in lines:
            changed = self._events.extend(self._parser.feed(line)) or changed
        events = list(self._events.events) if changed or restarted else None
        return LogRead(path=path, lines=lines, restarted=restarted, events=events)
