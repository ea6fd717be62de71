"""Writeback started while a file is written (`_io.writeback`): advice to the kernel that
never changes a byte, and that turns itself off where it is refused."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from lr_checkpoint._io.direct_io import DirectWriter
from lr_checkpoint._io.writeback import WRITEBACK_BYTES, Writeback, WritebackFile, start_writeback

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")


@linux
def test_start_writeback_is_taken_for_a_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    with open(path, "wb", buffering=0) as f:
        f.write(os.urandom(1 << 20))
        assert start_writeback(f.fileno(), 0, 1 << 20) is True
        assert start_writeback(f.fileno(), 0, 0) is False  # nothing to ask for


@linux
def test_writeback_stops_asking_where_it_is_refused() -> None:
    read_end, write_end = os.pipe()  # sync_file_range refuses a pipe (ESPIPE)
    try:
        assert start_writeback(write_end, 0, 4096) is False
        writeback = Writeback(write_end, every=10)
        writeback.wrote(5)
        assert writeback._on  # not asked yet: under `every`
        writeback.wrote(20)
        assert not writeback._on  # asked once, refused, never again
        writeback.wrote(1000)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_buffered_writer_output_is_unchanged_across_writeback_points(tmp_path: Path) -> None:
    """Pieces of odd sizes straddling several writeback points: the file is exactly their bytes."""
    data = os.urandom(2 * WRITEBACK_BYTES + 12345)
    cuts = [0, 7, WRITEBACK_BYTES - 3, WRITEBACK_BYTES + 5, 2 * WRITEBACK_BYTES + 1, len(data)]
    path = tmp_path / "out.bin"
    path.touch()
    writer = DirectWriter(path, direct=False)
    try:
        for a, b in zip(cuts, cuts[1:]):
            writer.write(memoryview(data)[a:b])
        assert writer.finish() == len(data)
    finally:
        writer.close()
    assert path.read_bytes() == data


def test_writeback_file_writes_what_it_is_given(tmp_path: Path) -> None:
    data = os.urandom(WRITEBACK_BYTES + 999)
    with WritebackFile(tmp_path / "w.bin", "wb") as f:
        assert f.write(data[:10]) == 10
        assert f.write(memoryview(data)[10:]) == len(data) - 10
    assert (tmp_path / "w.bin").read_bytes() == data


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_shards_are_the_bytes_dcp_writes(tmp_path: Path) -> None:
    """The shard writer of every DCP save writes the same files as DCP's own FileSystemWriter."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    from lr_checkpoint._formats.dcp.write import WritebackFileSystemWriter

    torch.manual_seed(0)
    state = {"big": torch.randn(WRITEBACK_BYTES // 4 + 1000), "small": torch.arange(10), "half": torch.randn(64, 64).to(torch.bfloat16)}
    save(state, storage_writer=FileSystemWriter(tmp_path / "dcp"), no_dist=True)
    save(state, storage_writer=WritebackFileSystemWriter(tmp_path / "ours"), no_dist=True)
    shards = sorted(p.name for p in (tmp_path / "dcp").glob("*.distcp"))
    assert shards and shards == sorted(p.name for p in (tmp_path / "ours").glob("*.distcp"))
    for name in shards:
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "dcp" / name).read_bytes(), name
