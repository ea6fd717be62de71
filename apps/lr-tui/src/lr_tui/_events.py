"""Known lines of a run's combined log, turned into events the Monitor highlights.

`EventParser.feed(line)` reads one line of `logs/launch.log` (every rank's output, and
torchrun's) and returns the events it completes. Each `Event` names the rank when the line
carries one (`[rank3]:` as the TUI launches, or torchrun's `[default3]:` local-rank prefix),
says what happened in a few words, and carries one line saying what to do.

What it knows, each checked against output captured from real runs (tests/data/):
- NCCL and gloo errors and timeouts, a broken rendezvous;
- a rank exiting with a signal (torchrun's `failed (exitcode: -9) local_rank: 1`), and the
  root cause of torchrun's ChildFailedError summary;
- out of memory: CUDA's "CUDA out of memory", the host's (torch's CPU allocator, Python's
  MemoryError, a shell's "Killed", a rank ended by SIGKILL);
- lr-engine's own lines: "checkpoint saving in the background: <path>" (an async save
  started), "checkpoint saved: <path>", a save that failed (a traceback through
  lr_checkpoint's save), "stopped at step N on request", a finished run's "train longer with:
  ... (any --steps above N)", "warning: resuming ... with changed settings: ...", the
  accelerate environment guard, and any other "lr-engine: error:";
- any other Python exception ending a traceback.

Tracebacks are followed per rank, so that interleaved ranks do not mix, and a chained
exception ("During handling of the above exception ...") of the same kind is reported once.
Once a run has finished (`EventLog`), none of its events suggests resuming it as it is:
their advice says a resume trains only with `--steps` above the final step.
Pure Python: no torch, no Textual.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Literal

__all__ = ["Event", "EventLog", "EventParser", "Severity", "parse_lines", "split_prefix"]

Severity = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Event:
    kind: str
    """nccl, gloo, rendezvous, rank_signal, child_failed, cuda_oom, host_oom,
    checkpoint_saved, checkpoint_failed, stopped, finished, resume_changed, accelerate_env,
    config_error or exception."""
    severity: Severity
    title: str
    """What happened, in a few words (`rank 1 killed by SIGKILL (exit -9)`)."""
    advice: str
    """One line: what to do about it."""
    line_number: int
    """1-based line of the log where it was seen (the first time, when repeated)."""
    rank: int | None = None
    """The global rank (`[rankN]:`), the local rank (`[defaultN]:`), or None (torchrun, one process)."""
    text: str = ""
    """The line itself, without its rank prefix."""
    count: int = 1
    """How many times it was seen in a row (a retrying rendezvous repeats itself)."""

    @property
    def where(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else "launcher"


_PREFIX = re.compile(r"^\[(?:rank|default|[A-Za-z_]*?)(\d+)\]:\s?")


def split_prefix(line: str) -> tuple[int | None, str]:
    """(rank, rest) for `[rank3]:rest` or `[default3]:rest`; (None, line) otherwise."""
    match = _PREFIX.match(line)
    if match is None:
        return None, line
    return int(match.group(1)), line[match.end() :]


# --- advice ---------------------------------------------------------------------------------

_CUDA_OOM = (
    "lower --batch_size (keep the effective batch with --accelerator.gradient_accumulation.steps), "
    "shard with --parallelism.dp_shard, or use --accelerator.mixed_precision=bf16"
)
_HOST_OOM = "the host ran out of RAM: lower --batch_size or --num_workers, or run fewer processes per node"
_KILLED = "SIGKILL from outside: the host OOM killer (check `dmesg`) or a kill (scheduler time or memory limit)"
_TIMEOUT = (
    "a rank stalled or died before this collective: find the first failure of another rank; "
    "raise LR_DIST_TIMEOUT_S only when steps or saves are legitimately slow"
)
_PEER_GONE = "a peer rank exited or the network dropped: read the root cause torchrun names below and that rank's first error"
_NCCL = "a peer rank may have exited first (find the root cause); else rerun with NCCL_DEBUG=INFO to see the failing link"
_RDZV_TIMEOUT = "not every node joined in time: start torchrun on every node with the same --rdzv-endpoint and --rdzv-id"
_RDZV_CONNECT = "cannot reach the rendezvous: check --rdzv-endpoint (HOST:PORT of node 0), that node 0 runs, and the firewall"
_SIGNAL_ADVICE = {
    signal.SIGKILL: _KILLED,
    signal.SIGTERM: "terminated: stopped on purpose, preempted by the scheduler, or torchrun ending the job after another rank failed",
    signal.SIGINT: "interrupted: a stop request (Ctrl-C or the TUI's stop)",
    signal.SIGABRT: "aborted in native code (an NCCL/gloo abort or a failed assertion): read this rank's last lines",
    signal.SIGSEGV: "crashed in native code: read this rank's last lines; try without compile or custom kernels",
    signal.SIGBUS: "bus error: often /dev/shm too small for the data loader (raise the container's shm size)",
}
_EXIT_ADVICE = {
    1: "it raised a Python exception: read its traceback above",
    2: "lr-engine refused a setting: read its 'lr-engine: error:' line above and fix that flag",
    3: "it stopped on request at an update and saved its checkpoint: resume it (Monitor: r)",
    130: "it was interrupted by a second stop signal",
}


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _exit_words(code: int) -> tuple[str, str]:
    """(how it ended, what to do) for a worker's exit code (negative: killed by a signal)."""
    if code < 0:
        name = _signal_name(code)
        try:
            advice = _SIGNAL_ADVICE.get(signal.Signals(-code), "read this rank's last lines")
        except ValueError:
            advice = "read this rank's last lines"
        return f"{name} (exit {code})", advice
    return f"exit {code}", _EXIT_ADVICE.get(code, "read this rank's last lines above")


# --- one-line rules -------------------------------------------------------------------------

@dataclass(frozen=True)
class _Rule:
    kind: str
    severity: Severity
    pattern: re.Pattern[str]
    describe: Callable[[re.Match[str]], tuple[str, str]]
    """match -> (title, advice)"""


def _fixed(title: str, advice: str) -> Callable[[re.Match[str]], tuple[str, str]]:
    return lambda _match: (title, advice)


def _resume_changed(match: re.Match[str]) -> tuple[str, str]:
    changes, exactness = match.group(2), match.group(3)
    if exactness.startswith("exact"):
        return f"resumed with changed settings: {changes}", "the data position is exact; check the changed layout is what you meant"
    return (
        f"resumed with changed settings: {changes} (not sample-exact)",
        "batch_size x dp_world_size or the seed changed, so the data order differs from the saved run; keep both equal for an exact resume",
    )


def _finished_advice(step: int) -> str:
    return f"to train longer, resume with steps above {step} (Monitor: r, the steps field); else nothing to do"


def _after_finish_advice(finished: Event) -> str:
    """The advice, once the run finished, of an earlier event that suggested resuming."""
    step = finished.title.rsplit(" ", 1)[-1]
    return f"the run finished at step {step}: a resume trains only with steps above {step}"


def _suggests_resuming(event: Event) -> bool:
    """Its advice says to resume with the Monitor's r (a saved checkpoint, a stop): not once the run has finished."""
    return event.kind != "finished" and ("r in the Monitor" in event.advice or "(Monitor: r)" in event.advice)


def _agent_exit(match: re.Match[str]) -> tuple[str, str]:
    code, local_rank = int(match.group(1)), match.group(2)
    how, advice = _exit_words(code)
    return f"local rank {local_rank} died: {how}", advice


_RULES: tuple[_Rule, ...] = (
    _Rule("cuda_oom", "error", re.compile(r"CUDA out of memory"), _fixed("CUDA out of memory", _CUDA_OOM)),
    _Rule(
        "host_oom", "error",
        re.compile(r"DefaultCPUAllocator: can't allocate memory: you tried to allocate (\d+) bytes"),
        lambda m: (f"host out of memory (could not allocate {int(m.group(1)) / 2**30:.1f} GiB)", _HOST_OOM),
    ),
    _Rule("host_oom", "error", re.compile(r"^MemoryError\b"), _fixed("host out of memory (MemoryError)", _HOST_OOM)),
    _Rule("host_oom", "error", re.compile(r"^(?:\S+: line \d+: +)?\d+ Killed\b|^Killed$"), _fixed("a process was killed (shell: Killed)", _KILLED)),
    _Rule(
        "nccl", "error",
        re.compile(r"Watchdog caught collective operation timeout|NCCL operation timed out"),
        _fixed("NCCL collective timed out", _TIMEOUT),
    ),
    _Rule(
        "nccl", "error",
        re.compile(r"NCCL error|NCCL WARN|nccl(?:System|Remote|Internal|UnhandledCuda|InvalidUsage|InvalidArgument)Error|NCCL communicator was aborted"),
        _fixed("NCCL error", _NCCL),
    ),
    _Rule(
        "gloo", "error",
        re.compile(r"gloo/.*Timed out waiting (\d+)ms for (\w+) operation"),
        lambda m: (f"gloo {m.group(2)} timed out after {int(m.group(1)) / 1000:g} s", _TIMEOUT),
    ),
    _Rule(
        "gloo", "error",
        re.compile(r"gloo/\S+\] (.*?(?:Connection reset by peer|Connection closed by peer|Connection refused|Read error|Write error)(?:[^.]|\.(?=\d))*)"),
        lambda m: (f"gloo: {m.group(1)}", _PEER_GONE),
    ),
    _Rule("rendezvous", "error", re.compile(r"RendezvousTimeoutError"), _fixed("rendezvous timed out waiting for the other nodes", _RDZV_TIMEOUT)),
    _Rule(
        "rendezvous", "error",
        re.compile(r"timed out after \d+ms while trying to connect to \(([^,]+), (\d+)\)"),
        lambda m: (f"cannot reach the rendezvous store {m.group(1)}:{m.group(2)}", _RDZV_CONNECT),
    ),
    _Rule("rendezvous", "error", re.compile(r"RendezvousConnectionError"), _fixed("cannot connect to the rendezvous store", _RDZV_CONNECT)),
    _Rule(
        "accelerate_env", "error",
        re.compile(r"accelerate environment variables would reconfigure the engine"),
        _fixed(
            "refused: accelerate environment variables would reconfigure the engine",
            "unset the variables listed below and use the lr flags they name, or set LR_ALLOW_ACCELERATE_ENV=1 to ignore them",
        ),
    ),
    _Rule("config_error", "error", re.compile(r"^lr-[a-z]+: error: (.*)"), lambda m: (m.group(1), "fix the flag or file it names, then launch again")),
    _Rule(
        "checkpoint_saving", "info",
        re.compile(r"^checkpoint saving in the background: (\S+)"),
        lambda m: (
            f"checkpoint saving in the background: {m.group(1).rstrip('/').rsplit('/', 1)[-1]}",
            "training goes on; `checkpoint saved` follows once it is committed (last moves only then)",
        ),
    ),
    _Rule(
        "checkpoint_saved", "info",
        re.compile(r"^checkpoint saved: (\S+)"),
        lambda m: (f"checkpoint saved: {m.group(1).rstrip('/').rsplit('/', 1)[-1]}", "resume from it with r in the Monitor, or copy the command in Checkpoints"),
    ),
    _Rule(
        "stopped", "info",
        re.compile(r"^stopped at step (\d+) on request( \(checkpoint saved\))?"),
        lambda m: (
            f"stopped at step {m.group(1)} on request" + (" (checkpoint saved)" if m.group(2) else ""),
            "resume with r in the Monitor" if m.group(2) else "no checkpoint was saved on stop (--save_checkpoint=false)",
        ),
    ),
    _Rule(
        "stopped", "info",
        re.compile(r"Received (\S+) death signal, shutting down workers"),
        lambda m: (f"torchrun got signal {m.group(1)}: passing it to the workers", "the workers stop at the next update (or the one after); a second stop interrupts them at once"),
    ),
    _Rule(
        "finished", "info",
        re.compile(r"^train longer with: .*\(any --steps above (\d+)\)"),
        lambda m: (f"finished at step {m.group(1)}", _finished_advice(int(m.group(1)))),
    ),
    _Rule(
        "resume_changed", "warning",
        re.compile(r"^warning: resuming (\S+) with changed settings: (.*); data position (.*)$"),
        _resume_changed,
    ),
    _Rule("rank_signal", "error", re.compile(r"\] failed \(exitcode: (-\d+)\) local_rank: (\d+)"), _agent_exit),
)


def _with_killed_kind(event: Event) -> Event:
    """A worker ended by SIGKILL is the host OOM killer's signature: file it with the OOMs."""
    if event.kind == "rank_signal" and "SIGKILL" in event.title:
        return replace(event, kind="host_oom")
    return event


# --- multi-line state -----------------------------------------------------------------------

_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Failure)\b)(?::\s*(.*))?$")
_CHAIN = ("During handling of the above exception", "The above exception was the direct cause")
_SAVE_FRAME = re.compile(r"lr_checkpoint/_save\.py|save_checkpoint|wait_for_pending_save")
_SILENT_EXCEPTIONS = ("ChildFailedError", "SignalException")
"""torchrun's own exceptions: the failure summary and the stop signal say it better."""


@dataclass
class _Traceback:
    open: bool = False
    chained: bool = False
    through_save: bool = False
    kinds: set[str] = field(default_factory=set)


@dataclass
class _Summary:
    """torchrun's ChildFailedError block: only its root cause becomes an event."""

    in_root: bool = False
    rank: int | None = None
    local_rank: int | None = None


_SUMMARY_RANK = re.compile(r"^\s+rank\s+: (\d+) \(local_rank: (\d+)\)")
_SUMMARY_EXIT = re.compile(r"^\s+exitcode\s+: (-?\d+)")


class EventParser:
    """Feed it a log's lines in order; it returns the events each line completes."""

    def __init__(self) -> None:
        self.line_number = 0
        self._tracebacks: dict[int | None, _Traceback] = {}
        self._summary = _Summary()

    def feed(self, raw: str) -> list[Event]:
        self.line_number += 1
        rank, line = split_prefix(raw.rstrip("\r\n"))
        return [_with_killed_kind(e) for e in self._summary_event(rank, line) + self._line_events(rank, line)]

    def _event(self, kind: str, severity: Severity, title: str, advice: str, rank: int | None, line: str) -> Event:
        return Event(kind=kind, severity=severity, title=title, advice=advice, line_number=self.line_number, rank=rank, text=line.strip())

    def _line_events(self, rank: int | None, line: str) -> list[Event]:
        tb = self._tracebacks.setdefault(rank, _Traceback())
        stripped = line.strip()
        if stripped.startswith("Traceback (most recent call last)"):
            if not tb.chained:
                self._tracebacks[rank] = tb = _Traceback()
            tb.open, tb.chained = True, False
            return []
        if stripped.startswith(_CHAIN):
            tb.chained = True
            return []
        if tb.open and (not stripped or line[:1].isspace() or stripped.startswith("<")):
            tb.through_save = tb.through_save or bool(_SAVE_FRAME.search(line))
            return []
        if tb.open:
            tb.open = False
            return self._exception_events(tb, rank, line)
        if stripped and not tb.chained:
            tb.kinds.clear()
        return [self._event(r.kind, r.severity, *r.describe(m), rank, line) for r in _RULES if (m := r.pattern.search(line))][:1]

    def _exception_events(self, tb: _Traceback, rank: int | None, line: str) -> list[Event]:
        """The line that ends a traceback: a known kind, a failed save, or a plain exception."""
        known = [self._event(r.kind, r.severity, *r.describe(m), rank, line) for r in _RULES if (m := r.pattern.search(line))][:1]
        match = _EXCEPTION_LINE.match(line.strip())
        if not known and match is not None and not match.group(1).endswith(_SILENT_EXCEPTIONS):
            name, message = match.group(1).rsplit(".", 1)[-1], (match.group(2) or "").strip()
            if tb.through_save:
                known = [self._event("checkpoint_failed", "error", f"checkpoint save failed: {name}: {message}",
                                     "the previous checkpoint and `last` are intact: fix the cause (disk space, permissions), then resume", rank, line)]
            else:
                known = [self._event("exception", "error", f"{name}: {message}" if message else name, "read the traceback above it", rank, line)]
        fresh = [e for e in known if e.kind not in tb.kinds]
        tb.kinds.update(e.kind for e in known)
        return fresh

    def _summary_event(self, rank: int | None, line: str) -> list[Event]:
        if rank is not None:
            return []
        if line.startswith("Root Cause (first observed failure)"):
            self._summary = _Summary(in_root=True)
            return []
        summary = self._summary
        if not summary.in_root:
            return []
        if line.startswith("===="):
            summary.in_root = False
            return []
        if match := _SUMMARY_RANK.match(line):
            summary.rank, summary.local_rank = int(match.group(1)), int(match.group(2))
            return []
        if (match := _SUMMARY_EXIT.match(line)) and summary.rank is not None:
            summary.in_root = False
            how, advice = _exit_words(int(match.group(1)))
            title = f"job failed: rank {summary.rank} failed first, {how}"
            return [self._event("child_failed", "error", title, advice, summary.rank, line)]
        return []


def parse_lines(lines: Iterable[str]) -> list[Event]:
    """Every event of a whole log, repeats folded (see `EventLog`)."""
    parser, log = EventParser(), EventLog()
    for line in lines:
        log.extend(parser.feed(line))
    return log.events


class EventLog:
    """The events of one log, in order; an event repeating one of the last few is counted, not added."""

    RECENT = 5

    def __init__(self) -> None:
        self.events: list[Event] = []

    def extend(self, events: Iterable[Event]) -> bool:
        """Add events; True when anything changed. A `finished` event rewrites the advice of the
        events before it that suggest resuming: the run trains no further unless --steps grows."""
        changed = False
        for event in events:
            if event.kind == "finished":
                self.events = [
                    replace(e, advice=_after_finish_advice(event)) if _suggests_resuming(e) else e
                    for e in self.events
                ]
            key = (event.kind, event.rank, event.title)
            for i in range(len(self.events) - 1, max(-1, len(self.events) - 1 - self.RECENT), -1):
                seen = self.events[i]
                if (seen.kind, seen.rank, seen.title) == key:
                    self.events[i] = replace(seen, count=seen.count + 1)
                    break
            else:
                self.events.append(event)
            changed = True
        return changed
