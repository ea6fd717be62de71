"""The converter's file I/O: its range reader, and its writer, direct (O_DIRECT) and
buffered (the same bytes either way)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lr_checkpoint._formats.dcp.stream import _Files
from lr_checkpoint._io.direct_io import ALIGN, DirectWriter, aligned_buffer


def test_reads_any_range_up_to_the_end_of_the_file(tmp_path: Path) -> None:
    data = os.urandom(3 * ALIGN + 123)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    files = _Files()
    try:
        for start, n in [(0, 1), (1, ALIGN), (ALIGN - 1, 2), (5, len(data) - 5), (len(data) - 7, 7), (2 * ALIGN, ALIGN + 123)]:
            buffer = aligned_buffer(n + 9)
            assert bytes(files.read(path, start, n, buffer)) == data[start : start + n]
        with pytest.raises(OSError, match=r"f\.bin: ends at byte .* before the 10 bytes at"):
            files.read(path, len(data) - 5, 10, aligned_buffer(10))
    finally:
        files.close()


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("total", [0, 1, ALIGN, 5 * ALIGN + 17])
def test_writes_a_stream_of_odd_pieces_and_cuts_the_padding(tmp_path: Path, direct: bool, total: int) -> None:
    data = os.urandom(total)
    path = tmp_path / "out.bin"
    path.touch()
    writer = DirectWriter(path, staging_bytes=2 * ALIGN, direct=direct)
    try:
        position = 0
        for size in [3, ALIGN + 1, 7, 3 * ALIGN, 1]:
            writer.write(memoryview(data)[position : position + size])
            position = min(total, position + size)
        writer.write(data[position:])
        assert writer.finish() == total
    finally:
        writer.close()
    assert path.read_bytes() == data


@pytest.mark.parametrize("direct", [True, False])
def test_a_failed_write_is_raised_and_close_does_not_hang(tmp_path: Path, direct: bool) -> None:
    """A write past the file size limit (a full disk alike), in the direct writer's worker
    thread or in place: `write` or `finish` raises it, and `close` returns."""
    import errno
    import resource

    path = tmp_path / "out.bin"
    path.touch()
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    writer = DirectWriter(path, staging_bytes=4 * ALIGN, direct=direct)
    resource.setrlimit(resource.RLIMIT_FSIZE, (10 * ALIGN, limit[1]))
    try:
        with pytest.raises(OSError) as caught:
            for _ in range(8):
                writer.write(os.urandom(3 * ALIGN))
            writer.finish()
        assert caught.value.errno == errno.EFBIG
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        writer.close()
