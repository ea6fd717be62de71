"""A run folder's status for the Monitor: `run.json`, the ETA, and the tail of its log.

Reads only files (`<run>/run.json`, the end of `<run>/metrics.jsonl`, `<run>/logs/*.log`);
never raises for a missing or half-written file, since the engine may be writing it at that
moment.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from lr_config import ConfigError, MetricsRecord, RunStatus, load_run_status
from lr_config.layout import METRICS, RUN_STATUS

from ._metrics_tail import last_record
from ._procs import process
from ._series import format_duration

__all__ = ["STALE_AFTER_S", "RunSummary", "eta_seconds", "log_tail", "newest_log", "process_gone", "silent_elsewhere", "stale_reason",
           "summarize_run"]

STALE_AFTER_S = 1800.0
"""A running run on another host (whose pid cannot be checked from here) is stale once its
run.json has not been updated for this long: lr-engine rewrites it at every logged step."""


@dataclass(frozen=True)
class RunSummary:
    state: str
    """running, finished, failed, stopped, stale (running but its process is gone), or 'no run.json'."""
    step: int = 0
    steps: int = 0
    eta: str = ""
    error: str = ""

    def line(self) -> str:
        parts = [self.state]
        if self.steps:
            parts.append(f"step {self.step}/{self.steps} ({100 * self.step // self.steps}%)")
        if self.eta:
            parts.append(f"ETA {self.eta}")
        return "   ".join(parts)


def eta_seconds(status: RunStatus, last: MetricsRecord | None = None) -> float | None:
    """Time left for a running run; None when it cannot be told.

    The pace is the last logged window's (`update_s + dataloading_s` per step, from
    metrics.jsonl): recent, and right for a resumed run, whose `run.json` step counts the
    steps before the resume while its `started` is the resume's time. Without a record, the
    pace from `started` to `updated` (start-up included)."""
    if status.status != "running" or status.step <= 0 or status.steps <= status.step:
        return None
    if last is not None and last.update_s + last.dataloading_s > 0:
        return (last.update_s + last.dataloading_s) * (status.steps - status.step)
    try:
        elapsed = (datetime.fromisoformat(status.updated) - datetime.fromisoformat(status.started)).total_seconds()
    except ValueError:
        return None
    if elapsed <= 0:
        return None
    return elapsed / status.step * (status.steps - status.step)


def process_gone(status: RunStatus) -> bool:
    """run.json says running, on this host, and its pid is gone (or a zombie)."""
    if status.status != "running" or status.pid <= 0 or status.hostname != socket.gethostname():
        return False
    proc = process(status.pid)
    return proc is None or not proc.alive


def silent_elsewhere(status: RunStatus, now: datetime | None = None) -> float | None:
    """Seconds since run.json was last updated, for a run that says running on another host and
    has been silent for more than STALE_AFTER_S; None otherwise (or when `updated` is unreadable)."""
    if status.status != "running" or status.hostname == socket.gethostname():
        return None
    try:
        updated = datetime.fromisoformat(status.updated)
    except ValueError:
        return None
    if updated.tzinfo is None:  # lr-engine writes UTC with its offset; a bare time is read as UTC
        updated = updated.replace(tzinfo=timezone.utc)
    silent = ((now or datetime.now(timezone.utc)) - updated).total_seconds()
    return silent if silent > STALE_AFTER_S else None


def stale_reason(status: RunStatus) -> str | None:
    """Why a run that says running is not: its process is gone (this host), or it has been silent
    on another host for longer than STALE_AFTER_S; None when it may well be running."""
    if process_gone(status):
        return "process gone"
    silent = silent_elsewhere(status)
    if silent is not None:
        return f"no update for {format_duration(silent)} on {status.hostname or 'another host'}"
    return None


def summarize_run(output_dir: Path) -> RunSummary:
    path = Path(output_dir) / RUN_STATUS
    if not path.exists():
        return RunSummary(state="no run.json yet")
    try:
        status = load_run_status(path)
    except ConfigError as exc:
        return RunSummary(state="unreadable run.json", error=str(exc))
    eta = eta_seconds(status, last_record(Path(output_dir) / METRICS) if status.status == "running" else None)
    reason = stale_reason(status)
    state = f"stale ({reason})" if reason else status.status
    return RunSummary(
        state=state,
        step=status.step,
        steps=status.steps,
        eta=format_duration(eta) if eta is not None else "",
        error=status.error or "",
    )


_CLI_ERROR = re.compile(r"^(\[[^\]]*\]:?\s*)?lr-[a-z]+: error: ")


def newest_log(output_dir: Path) -> Path | None:
    """The run's combined log: the newest `<run>/logs/*.log` (the TUI writes `launch.log`)."""
    logs = sorted((Path(output_dir) / "logs").glob("*.log"), key=lambda p: (p.stat().st_mtime, p.name))
    return logs[-1] if logs else None


def log_tail(output_dir: Path, lines: int = 20) -> tuple[Path, str] | None:
    """The newest `<run>/logs/*.log` and its last `lines` lines, or None without logs.

    When an lr CLI's own `lr-<cli>: error: ...` line is further up (torchrun prints its
    traceback after it), that line comes first: it is the cause to read."""
    newest = newest_log(output_dir)
    if newest is None:
        return None
    with newest.open("rb") as f:
        f.seek(max(0, newest.stat().st_size - 64 * 1024))
        text = f.read().decode("utf-8", errors="replace")
    all_lines = text.splitlines()
    tail = all_lines[-lines:]
    causes = [line for line in all_lines[:-lines] if _CLI_ERROR.match(line)]
    return newest, "\n".join(causes[-1:] + (["..."] if causes else []) + tail)
