"""The one user-facing error of lr-checkpoint.

`CheckpointError` is a `lr_config.ConfigError`, so every lr CLI already prints it and exits
2. Its message names the file or folder at fault and what to do about it.
"""

from __future__ import annotations

from lr_config import ConfigError

__all__ = ["CheckpointError"]


class CheckpointError(ConfigError):
    """A checkpoint problem the user can fix: a missing, partial or mismatched file."""
