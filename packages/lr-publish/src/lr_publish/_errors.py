"""Errors of lr-publish, all `lr_config.ConfigError`s so every CLI prints them without a traceback.

- `PublishError`: what is to be published cannot be (a DCP-only checkpoint, a missing file,
  a folder that already exists, a bad repo id, no token). Nothing was sent.
- `HubPushError`: the Hub refused the push for good (401, 403, 404, bad metadata). The
  local publish folder is intact; `retry_command` pushes it again once the cause is fixed.
- `HubUnavailableError`: the Hub kept failing transiently (connection refused, 5xx, 429)
  after every retry. Same folder and retry command; exit code 1 instead of 2, since the fix
  is to wait, not to change a setting.
"""

from __future__ import annotations

from pathlib import Path

from lr_config import ConfigError

__all__ = ["HubPushError", "HubUnavailableError", "PublishError"]


class PublishError(ConfigError):
    """A model or folder that cannot be published as it is; the message says what to change."""

    exit_code = 2


class HubPushError(PublishError):
    """The Hub refused the push. `folder` is intact and `retry_command` pushes it again."""

    def __init__(self, message: str, *, folder: Path, retry_command: str, status: int | None = None) -> None:
        super().__init__(f"{message}\nThe publish folder is intact: {folder}\nRetry the push with:\n  {retry_command}")
        self.folder = folder
        self.retry_command = retry_command
        self.status = status


class HubUnavailableError(HubPushError):
    """The Hub stayed unreachable or overloaded through every retry."""

    exit_code = 1
