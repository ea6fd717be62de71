"""The error every problem of lr's data layer raises."""

from __future__ import annotations

from lr_config import ConfigError


class DatasetError(ConfigError):
    """A dataset problem the user can fix; names the file or feature."""
