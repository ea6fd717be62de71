"""Processes of this host, read from /proc (Linux), and signals to them.

`process(pid)` reads `/proc/<pid>/stat`: parent, process group, session, state and start
time (clock ticks since boot, which together with the pid names one process even after
the pid is reused). `descendants(pid)` walks the parent links of every process once.
`signal_group` and `signal_process` send a signal and say whether anything received it.
No psutil: lr-tui depends on nothing that reads processes.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Proc", "all_processes", "descendants", "process", "signal_group", "signal_process"]

PROC = Path("/proc")


@dataclass(frozen=True)
class Proc:
    pid: int
    comm: str
    state: str
    """R, S, D, T, Z (zombie: ended, not yet reaped), ..."""
    ppid: int
    pgid: int
    sid: int
    start_ticks: int

    @property
    def alive(self) -> bool:
        return self.state not in ("Z", "X")


def _parse_stat(text: str) -> Proc | None:
    # comm is in parentheses and may itself contain spaces or parentheses
    head, _, rest = text.rpartition(")")
    pid_text, _, comm = head.partition(" (")
    fields = rest.split()
    if len(fields) < 20 or not pid_text.strip().isdigit():
        return None
    return Proc(
        pid=int(pid_text),
        comm=comm,
        state=fields[0],
        ppid=int(fields[1]),
        pgid=int(fields[2]),
        sid=int(fields[3]),
        start_ticks=int(fields[19]),
    )


def process(pid: int) -> Proc | None:
    """The process `pid` as /proc describes it now; None when there is none."""
    if pid <= 0:
        return None
    try:
        return _parse_stat((PROC / str(pid) / "stat").read_text())
    except (OSError, ValueError):
        return None


def all_processes() -> list[Proc]:
    procs: list[Proc] = []
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (proc := process(int(entry.name))) is not None:
            procs.append(proc)
    return procs


def descendants(pid: int, procs: list[Proc] | None = None) -> list[Proc]:
    """Every living process below `pid` (children, their children, ...)."""
    children: dict[int, list[Proc]] = {}
    for proc in all_processes() if procs is None else procs:
        children.setdefault(proc.ppid, []).append(proc)
    found: list[Proc] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child.alive:
                found.append(child)
            stack.append(child.pid)
    return found


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send `sig` to every process of group `pgid`; False when the group is gone (or is ours)."""
    if pgid == os.getpgrp():
        return False
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def signal_process(pid: int, sig: signal.Signals) -> bool:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True
