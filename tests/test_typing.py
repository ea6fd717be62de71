"""`mypy --strict` passes on lr-checkpoint and lr-publish (lr-config checks itself in its own
tests). One invocation over both, so torch's types are analysed once; it starts when the
session's collection ends (`_support/typing_run.py`), and this test waits for its result."""

from __future__ import annotations

from _support import typing_run


def test_mypy_strict_on_checkpoint_and_publish() -> None:
    code, out, err = typing_run.result(timeout=900)
    assert code == 0, out[-4000:] + err[-2000:]
    assert "Success: no issues found" in out
