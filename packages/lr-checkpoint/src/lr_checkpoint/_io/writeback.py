"""Start writing a file's bytes to disk while the file is still being written.

Every save ends with fsync, which waits until each dirty byte of the file is on the disk.
The kernel starts writing dirty pages on its own only once they pass a share of memory
(`vm.dirty_background_ratio`: gigabytes on a training node), so a checkpoint's bytes would
sit in the page cache until that fsync: the disk idles while the saver copies, then the
saver idles while the disk writes. `Writeback.wrote(position)` asks the kernel, every
`WRITEBACK_BYTES`, to start writing what came before: Linux's
`sync_file_range(SYNC_FILE_RANGE_WRITE)` queues those writes and returns; it does not wait
for them, and the pages stay in the cache for a load that follows. The disk then works
during the copy and the final fsync has only the last piece left. Where there is no
`sync_file_range` (not Linux), or it fails (a filesystem that refuses it), nothing is
asked and the fsync does all of the work, as it would without this module.

Used by the safetensors savers (`_io.direct_io.DirectWriter`, buffered) and by the DCP shard
writer (`_formats.dcp.write.WritebackFileSystemWriter`). Measured on the benchmark machine
with a hint every 16 MiB: a single-process save of 604 MB took 0.72 s instead of 0.90 s
(64 MiB: 0.75 s), a two-rank FSDP2 `safetensors_dcp` save 1.39 s instead of 1.76 s, and a
`dcp` save 0.83 s instead of 0.90 s; the files are byte-identical.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable
from typing import Any, cast

__all__ = ["WRITEBACK_BYTES", "Writeback", "WritebackFile", "start_writeback"]

WRITEBACK_BYTES = 16 << 20
_SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h: start writeback of the range's dirty pages, do not wait

_sync_file_range: Callable[[int, int, int, int], int] | None = None
_looked_up = False


def _lookup() -> Callable[[int, int, int, int], int] | None:
    """libc's sync_file_range on Linux (ctypes releases the GIL around the call), else None."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # only here: the converter imports this module and starts in a fraction of a second

    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return cast(Callable[[int, int, int, int], int], function)


def start_writeback(fd: int, offset: int, nbytes: int) -> bool:
    """Ask the kernel to start writing `[offset, offset + nbytes)` of the open file `fd` to disk
    without waiting; False where it cannot be asked (it is advice: the data is safe either way)."""
    global _sync_file_range, _looked_up
    if not _looked_up:
        _sync_file_range, _looked_up = _lookup(), True
    if _sync_file_range is None or nbytes <= 0:
        return False
    return _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE) == 0


class Writeback:
    """Tracks how far a file written front to back has got, and starts the writeback of each
    further `every` bytes. After a refusal it asks no more for this file."""

    def __init__(self, fd: int, every: int = WRITEBACK_BYTES) -> None:
        self._fd, self._every = fd, every
        self._started = 0
        self._on = True

    def wrote(self, position: int) -> None:
        """The file now holds its bytes up to `position`."""
        if self._on and position - self._started >= self._every:
            self._on = start_writeback(self._fd, self._started, position - self._started)
            self._started = position


class WritebackFile(io.FileIO):
    """A file opened for writing whose `write` starts the writeback as it goes (the stream the
    DCP shard writer gets, under its buffer)."""

    def __init__(self, path: str | os.PathLike[str], mode: str) -> None:
        super().__init__(path, mode)
        self._writeback = Writeback(self.fileno())

    def write(self, data: Any) -> int:
        written = super().write(data)
        if written:
            self._writeback.wrote(self.tell())
        return written if written is not None else 0
