"""SHA-256 of a stream of bytes, hashed beside the I/O that moves them.

The savers and the resume loader hash a file's bytes while they write or read them, instead
of reading the file again afterwards: `update(view)` hands a buffer to a worker thread and
returns at once (hashlib releases the GIL on large buffers), so hashing chunk k overlaps
writing or reading chunk k+1. The caller must leave a buffer untouched until its next
`update` or `digest` returns, which wait for the previous chunk.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import Future, ThreadPoolExecutor

from lr_config import FileDigest

__all__ = ["StreamHasher"]


class StreamHasher:
    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lr-sha256")
        self._last: Future[None] | None = None
        self._size = 0

    def _wait(self) -> None:
        if self._last is not None:
            last, self._last = self._last, None
            last.result()

    def update(self, view: memoryview | bytes) -> None:
        self._wait()
        self._size += len(view)
        self._last = self._pool.submit(self._sha.update, view)

    def digest(self) -> FileDigest:
        try:
            self._wait()
        finally:
            self.close()
        return FileDigest(size=self._size, sha256=self._sha.hexdigest())

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> StreamHasher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
