"""Which processes a run has, whether they live, and how to stop them.

A launch from the TUI starts the launcher (torchrun or accelerate) in its own session, so
its process group is its pid, and records it in `<output_dir>/logs/launch.json` (pid, start
time in clock ticks, host, argv). Reopening the folder later, even from a new TUI, finds
the launcher again from that record; the start time guards against a reused pid.

`liveness(...)` says what is alive now: the recorded launcher and every process below it
(torchrun starts each worker in a session of its own), else the pid `run.json` names (the
main rank, for a run started outside the TUI).

Stopping goes in stages (`STOP_STAGES`): SIGINT, then SIGTERM, then SIGKILL. The first two
go to the launcher's process group: torchrun passes each signal on to every worker, and
lr-engine stops at the next update boundary (or the one after) on the first (final
checkpoint, run.json "stopped") and at once on the second. Without a recorded launcher
they go to the main rank's pid; the engine agrees the stop over all ranks, so the whole
job stops. SIGKILL, the last resort, goes to the launcher's group and to every process
below it.
"""

from __future__ import annotations

import json
import signal
import socket
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from lr_config import RunStatus

from ._procs import Proc, all_processes, descendants, process, signal_group, signal_process

__all__ = [
    "LAUNCH_RECORD",
    "STOP_STAGES",
    "LaunchRecord",
    "Liveness",
    "liveness",
    "read_launch_record",
    "send_stop",
    "write_launch_record",
]

LAUNCH_RECORD = Path("logs") / "launch.json"
STOP_STAGES = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)


@dataclass(frozen=True)
class LaunchRecord:
    pid: int
    """The launcher: leader of its own session and process group."""
    start_ticks: int
    hostname: str
    argv: list[str]
    started: str
    version: int = 1


def write_launch_record(output_dir: Path, pid: int, argv: list[str]) -> LaunchRecord:
    proc = process(pid)
    record = LaunchRecord(
        pid=pid,
        start_ticks=proc.start_ticks if proc is not None else 0,
        hostname=socket.gethostname(),
        argv=list(argv),
        started=datetime.now().astimezone().isoformat(timespec="seconds"),
    )
    path = Path(output_dir) / LAUNCH_RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(record), indent=2) + "\n")
    return record


def read_launch_record(output_dir: Path) -> LaunchRecord | None:
    """The TUI's record of the launch in `output_dir`; None when absent or unreadable."""
    try:
        data = json.loads((Path(output_dir) / LAUNCH_RECORD).read_text())
        return LaunchRecord(**data) if data.get("version") == 1 else None
    except (OSError, ValueError, TypeError):
        return None


@dataclass(frozen=True)
class Liveness:
    launcher: Proc | None = None
    """The recorded launcher, while it runs."""
    workers: tuple[Proc, ...] = ()
    """Living processes below the launcher."""
    main: Proc | None = None
    """run.json's pid (the main rank), while it runs on this host."""
    elsewhere: str = ""
    """The host of a run on another machine (nothing can be checked from here)."""
    known: bool = True
    """False when there is nothing to check: no launch record and no pid in run.json."""

    @property
    def alive(self) -> bool:
        return self.launcher is not None or self.main is not None

    def describe(self) -> str:
        if self.elsewhere:
            return f"on host {self.elsewhere}"
        if self.launcher is not None:
            return f"{1 + len(self.workers)} alive (launcher {self.launcher.pid} + {len(self.workers)})"
        if self.main is not None:
            return f"pid {self.main.pid} alive"
        return "none alive" if self.known else "-"


def _recorded_launcher(record: LaunchRecord | None) -> Proc | None:
    if record is None or record.hostname != socket.gethostname():
        return None
    proc = process(record.pid)
    if proc is None or not proc.alive or proc.start_ticks != record.start_ticks:
        return None
    return proc


def liveness(record: LaunchRecord | None, status: RunStatus | None, procs: list[Proc] | None = None) -> Liveness:
    """What runs now of the launch `record` and of the run `status` describes."""
    launcher = _recorded_launcher(record)
    workers: tuple[Proc, ...] = ()
    if launcher is not None:
        workers = tuple(descendants(launcher.pid, procs if procs is not None else all_processes()))
    main: Proc | None = None
    elsewhere = ""
    if status is not None and status.pid > 0:
        if status.hostname and status.hostname != socket.gethostname():
            elsewhere = status.hostname if launcher is None else ""
        elif (proc := process(status.pid)) is not None and proc.alive:
            main = proc
    known = record is not None or (status is not None and status.pid > 0)
    return Liveness(launcher=launcher, workers=workers, main=main, elsewhere=elsewhere, known=known)


def send_stop(live: Liveness, stage: int) -> str:
    """Send stop stage `stage` (0 SIGINT, 1 SIGTERM, 2+ SIGKILL); say what was signalled, or ''."""
    sig = STOP_STAGES[min(stage, len(STOP_STAGES) - 1)]
    if live.launcher is not None:
        sent = _signal_leader(live.launcher, sig)
        if sig == signal.SIGKILL:
            for proc in live.workers:
                sent = _signal_leader(proc, sig) or sent
        return f"{sig.name} to the launch's process group {live.launcher.pgid}" if sent else ""
    if live.main is not None and signal_process(live.main.pid, sig):
        return f"{sig.name} to the main rank (pid {live.main.pid})"
    return ""


def _signal_leader(proc: Proc, sig: signal.Signals) -> bool:
    """Its whole group when it leads one (as the TUI starts launchers); else the process alone."""
    if proc.pgid == proc.pid:
        return signal_group(proc.pgid, sig)
    return signal_process(proc.pid, sig)
