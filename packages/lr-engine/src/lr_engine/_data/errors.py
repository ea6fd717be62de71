"""The error every problem of lr's data layer raises."""

from __future__ import annotations

from lr_config import ConfigError


class DatasetError(ConfigError):
    """A dataset problem the user can fix; names the file or feature."""


def from_worker(exc: DatasetError) -> DatasetError:
    """The DatasetError a DataLoader worker raised, without the worker's traceback.

    torch re-raises a worker's exception in the main process as the same type whose message
    is "Caught DatasetError in DataLoader worker process N. Original Traceback ...": the
    user's message is the traceback's last line, after the exception's name."""
    text = str(exc)
    if "Original Traceback" not in text:
        return exc
    last = text.rstrip().splitlines()[-1]
    return DatasetError(last.split("DatasetError: ", 1)[1] if "DatasetError: " in last else last)
