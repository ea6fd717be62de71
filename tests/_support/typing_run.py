"""`mypy --strict` over lr-checkpoint and lr-publish, started as soon as the session knows it
will run tests/test_typing.py, at the lowest CPU priority (nice 19).

A cold mypy run analyses torch's inline types and takes 70-80 s of one core. Started when
collection ends, it uses the CPU the rest of the suite leaves idle (processes starting,
launchers waiting, Textual pilots pausing) and is done, or nearly, when test_typing.py (in
`tests/`, collected last) asks for its result. The check is the same; only its start moves.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [str(ROOT / "packages" / name / "src") for name in ("lr-checkpoint", "lr-publish")]
COMMAND = [sys.executable, "-m", "mypy", "--strict", *SOURCES]

_proc: subprocess.Popen[str] | None = None


def start() -> None:
    global _proc
    if _proc is None:
        _proc = subprocess.Popen(COMMAND, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 preexec_fn=lambda: os.nice(19))


def result(timeout: float) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of the run, started now if it was not."""
    start()
    assert _proc is not None
    out, err = _proc.communicate(timeout=timeout)
    return _proc.returncode, out, err


def stop() -> None:
    """At the session's end: a run nobody waited for (a session stopped early) is killed."""
    if _proc is not None and _proc.poll() is None:
        _proc.kill()
        _proc.wait()
