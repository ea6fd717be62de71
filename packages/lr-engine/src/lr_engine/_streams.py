"""Standard output and error that never fail a run.

A run's console is a convenience; its files (metrics.jsonl, run.json, the checkpoints) are
the record. When the reader of stdout or stderr goes away (`lr-engine train | tee log` whose
`tee` the same Ctrl+C killed, `| head`, a closed terminal or ssh session), the next write
raises BrokenPipeError (Python ignores SIGPIPE, so the write fails with EPIPE), and an
unguarded print in the stop path would fail the run and lose its stop checkpoint.

`guard_streams()` (called first by every lr-engine process, on every rank) wraps
`sys.stdout` and `sys.stderr`. A write or flush that fails with an OS error points that
file descriptor at /dev/null, so that later writes (Python's, torch's C++ warnings on the
same descriptor, and the flush at exit) succeed without output, and the run goes on. The
other stream is untouched: a closed stdout still leaves stderr's messages visible.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

__all__ = ["GuardedStream", "guard_streams"]


class GuardedStream:
    """A text stream that turns its own failures into silence (see the module docstring)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.lost = False
        """True once the reader went away: everything written since went to /dev/null."""

    def _silence(self) -> None:
        self.lost = True
        try:
            fd = self._stream.fileno()
        except (OSError, ValueError):  # closed, or not a file: drop output in Python only
            self._stream = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)
        try:
            self._stream.flush()  # the buffered bytes now go to /dev/null
        except (OSError, ValueError):
            self._stream = open(os.devnull, "w")  # noqa: SIM115

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except (OSError, ValueError):
            self._silence()
            return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            self._silence()

    def isatty(self) -> bool:
        try:
            return not self.lost and self._stream.isatty()
        except (OSError, ValueError):
            return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_streams() -> None:
    """Wrap sys.stdout and sys.stderr once (idempotent)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, GuardedStream):
            setattr(sys, name, GuardedStream(stream))
