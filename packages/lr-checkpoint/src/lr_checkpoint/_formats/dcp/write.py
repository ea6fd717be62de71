"""DCP's shard writer, with the shard files' writeback started as they are written.

`FileSystemWriter` writes each rank's `.distcp` file through `self.fs.create_stream`, then
fsyncs it. `WritebackFileSystemWriter` only swaps the file under that stream for a
`_io.writeback.WritebackFile`, so the disk writes the shard while the rest of it is still being
serialized, and the fsync waits for the last piece only. Everything else (planning,
metadata, threads, async saves) is DCP's own.
"""

from __future__ import annotations

import io
import os
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter

from ..._io.writeback import WritebackFile

__all__ = ["WritebackFileSystemWriter"]


class _WritebackFileSystem(FileSystem):
    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[io.IOBase, None, None]:
        if mode != "wb":  # reads and appends: DCP's own
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with io.BufferedWriter(WritebackFile(Path(path), "wb")) as stream:
            yield stream


class WritebackFileSystemWriter(FileSystemWriter):
    """`FileSystemWriter` whose shard files start their writeback as they are written."""

    def __init__(self, path: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.fs = _WritebackFileSystem()
