"""The exception types of the contract.

Every problem a user can fix (a flag, a value, a file) is raised as `ConfigError` with a
message that names what to change. CLIs catch it, print the message and exit 2.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["CheckpointError", "ConfigError", "did_you_mean"]


class ConfigError(ValueError):
    """A user-fixable problem. `str(err)` is the whole message shown to the user."""

    def __init__(self, message: str, *, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems: list[str] = problems if problems is not None else [message]


class CheckpointError(ConfigError):
    """A checkpoint problem the user can fix: a missing, partial or mismatched file. It is
    defined here, beside the checkpoint layout (`lr_config.layout`), so that torch-free
    readers (lr-tui, the flag parser) raise the same error lr-checkpoint does."""


def did_you_mean(word: str, choices: Iterable[str], *, n: int = 3) -> str:
    """Return ' (did you mean X?)' for the closest choices, or '' when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=n, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"
