"""`_formats.torch_save.locate`, lr's own parse of a `torch.save` archive (a zip file), against the
stdlib's `zipfile` reading the same bytes, on archives torch writes, on their zip64 form,
and on damaged ones (never an exception, never a range outside the item); and
`read_stored`, which reads an archive front to back and must agree with `locate`."""

from __future__ import annotations

import io
import os
import struct
import zipfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lr_checkpoint._formats.torch_save import _EDGE, Stored, _guess, locate, read_stored

PREFIX = 7  # the item starts at this offset of its file, as DCP items after the first do


def archive_of(tensor: torch.Tensor) -> bytes:
    blob = io.BytesIO()
    torch.save(tensor, blob)
    return blob.getvalue()


def locate_bytes(tmp_path: Path, archive: bytes) -> Stored | None:
    path = tmp_path / "item.distcp"
    path.write_bytes(b"\xaa" * PREFIX + archive + b"\xbb" * 9)  # other items' bytes around it
    fd = os.open(path, os.O_RDONLY)
    try:
        return locate(fd, PREFIX, len(archive))
    finally:
        os.close(fd)


def zipfile_data_start(archive: bytes, key: str) -> int:
    """The oracle: where the stdlib's zipfile finds the bytes of record data/<key>."""
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        info = next(i for i in z.infolist() if i.filename.partition("/")[2] == f"data/{key}")
        head = archive[info.header_offset : info.header_offset + 30]
        name_len, extra_len = struct.unpack("<2H", head[26:30])
        return info.header_offset + 30 + name_len + extra_len


TENSORS = {
    "f32 matrix": torch.randn(3, 5),
    "bf16": torch.randn(4, 3).to(torch.bfloat16),
    "f16 3-d": torch.randn(2, 3, 4).to(torch.float16),
    "i64": torch.arange(6),
    "bool": torch.tensor([True, False, True]),
    "u8 odd size": torch.tensor([1, 2, 3], dtype=torch.uint8),
    "scalar": torch.tensor(2.5, dtype=torch.float64),
    "empty": torch.empty(0, 4),
    "row slice of a bigger storage": torch.arange(40, dtype=torch.float32).reshape(8, 5)[3:6],
}


@pytest.mark.parametrize("name", list(TENSORS))
def test_locate_finds_the_tensor_bytes_where_zipfile_does(tmp_path: Path, name: str) -> None:
    tensor = TENSORS[name]
    archive = archive_of(tensor)
    found = locate_bytes(tmp_path, archive)
    assert found is not None
    assert found.dtype == str(tensor.dtype).removeprefix("torch.") and found.shape == tuple(tensor.shape)
    offset_bytes = tensor.storage_offset() * tensor.element_size()
    assert found.start == PREFIX + zipfile_data_start(archive, "0") + offset_bytes
    data = (tmp_path / "item.distcp").read_bytes()[found.start : found.start + found.nbytes]
    assert data == tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def test_a_strided_view_is_left_to_dcp(tmp_path: Path) -> None:
    assert locate_bytes(tmp_path, archive_of(torch.randn(4, 6).t())) is None
    assert locate_bytes(tmp_path, archive_of({"a": torch.zeros(2)})) is None  # not a tensor archive


def as_zip64(archive: bytes) -> bytes:
    """The same archive with every directory entry's sizes and offset moved into a zip64
    extra field and the end-of-directory record saturated, as a writer does for records or
    archives over 4 GiB (too big to write in a test)."""
    eocd = archive[-22:]
    _, _, _, _, entries, dir_size, dir_offset, _ = struct.unpack("<4s4H2LH", eocd)
    directory = archive[dir_offset : dir_offset + dir_size]
    out, at = [], 0
    for _ in range(entries):
        fixed = bytearray(directory[at : at + 46])
        name_len, extra_len, comment_len = struct.unpack_from("<3H", fixed, 28)
        file_size, size = struct.unpack_from("<2L", fixed, 20)[::-1]
        header = struct.unpack_from("<L", fixed, 42)[0]
        rest = directory[at + 46 : at + 46 + name_len + extra_len + comment_len]
        name, extra, comment = rest[:name_len], rest[name_len : name_len + extra_len], rest[name_len + extra_len :]
        zip64 = struct.pack("<2H3Q", 1, 24, file_size, size, header)
        struct.pack_into("<2L", fixed, 20, 0xFFFFFFFF, 0xFFFFFFFF)
        struct.pack_into("<L", fixed, 42, 0xFFFFFFFF)
        struct.pack_into("<H", fixed, 30, len(zip64) + len(extra))
        out.append(bytes(fixed) + name + zip64 + extra + comment)
        at += 46 + name_len + extra_len + comment_len
    new_directory = b"".join(out)
    zip64_eocd = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, entries, entries, len(new_directory), dir_offset)
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, dir_offset + len(new_directory), 1)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return archive[:dir_offset] + new_directory + zip64_eocd + locator + end


def test_a_zip64_directory_gives_the_same_answer(tmp_path: Path) -> None:
    tensor = torch.randn(5, 3)
    archive = archive_of(tensor)
    wide = as_zip64(archive)
    with zipfile.ZipFile(io.BytesIO(wide)) as z:  # the rewrite is a valid zip64 archive
        assert z.testzip() is None
        assert [i.header_offset for i in z.infolist()] == [i.header_offset for i in zipfile.ZipFile(io.BytesIO(archive)).infolist()]
    assert locate_bytes(tmp_path, wide) == locate_bytes(tmp_path, archive) is not None
    # the tensor's record with saturated fields and no zip64 extra field: its sizes and offset
    # are not guessed at (the record's place is out of the item: no answer, not a wrong one)
    broken = bytearray(wide)
    broken[broken.index(b"\x01\x00\x18\x00", broken.rindex(b"/data/0"))] = 0x09  # no longer zip64's extra field
    assert locate_bytes(tmp_path, bytes(broken)) is None


def test_records_that_do_not_match_their_crc_are_refused(tmp_path: Path) -> None:
    archive = archive_of(torch.zeros(77))
    assert locate_bytes(tmp_path, archive) is not None
    # data.pkl with the shape 77 changed to 76: it still unpickles to a tensor that fits its
    # record, so only the record's CRC-32 tells
    pkl_at = archive.index(b"data.pkl") + len(b"data.pkl")
    at = archive.index(b"K\x4d", pkl_at)  # BININT1 77
    damaged = archive[:at] + b"K\x4c" + archive[at + 2 :]
    with zipfile.ZipFile(io.BytesIO(damaged)) as z, pytest.raises(zipfile.BadZipFile, match="CRC"):
        z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    assert locate_bytes(tmp_path, damaged) is None
    flipped = bytearray(archive)
    flipped[archive.index(b"little")] ^= 0x01  # the byteorder record
    assert locate_bytes(tmp_path, bytes(flipped)) is None


SAMPLE = archive_of(torch.arange(12, dtype=torch.float32).reshape(3, 4))


@settings(max_examples=300, deadline=None)
@given(
    flips=st.lists(st.tuples(st.integers(0, len(SAMPLE) - 1), st.integers(1, 255)), max_size=4),
    cut=st.integers(0, 40),
)
def test_a_damaged_archive_never_raises_and_never_points_outside_the_item(tmp_path_factory: pytest.TempPathFactory, flips: list[tuple[int, int]], cut: int) -> None:
    damaged = bytearray(SAMPLE)
    for at, mask in flips:
        damaged[at] ^= mask
    damaged = damaged[: len(damaged) - cut]
    found = locate_bytes(tmp_path_factory.mktemp("fuzz"), bytes(damaged))
    if found is not None:
        assert PREFIX <= found.start and found.start + found.nbytes <= PREFIX + len(damaged)


def read_stored_bytes(tmp_path: Path, archive: bytes) -> tuple[Stored | None, bytes]:
    """`read_stored` on `archive` at PREFIX of a file, into a fresh buffer; (where, what it read)."""
    path = tmp_path / "item.distcp"
    path.write_bytes(b"\xaa" * PREFIX + archive + b"\xbb" * 9)
    buffers: list[bytearray] = []

    def buffer_for(stored: Stored) -> memoryview:
        buffers.append(bytearray(b"\xee" * stored.nbytes))  # not zeros: a read that misses shows
        return memoryview(buffers[-1])

    fd = os.open(path, os.O_RDONLY)
    try:
        found = read_stored(fd, PREFIX, len(archive), buffer_for)
    finally:
        os.close(fd)
    return found, bytes(buffers[-1]) if buffers else b""


BIG = {
    **TENSORS,
    "f32 over the edge": torch.randn(40, 50),
    "bf16 over the edge": torch.randn(3000).to(torch.bfloat16),
    "offset view of a big storage": torch.arange(6000, dtype=torch.float32)[1500:4500].view(50, 60),
    "big i64": torch.arange(2000),
}


@pytest.mark.parametrize("name", list(BIG))
def test_read_stored_reads_what_locate_finds(tmp_path: Path, name: str) -> None:
    tensor = BIG[name]
    archive = archive_of(tensor)
    found, data = read_stored_bytes(tmp_path, archive)
    assert found is not None and found == locate_bytes(tmp_path, archive)
    assert data == tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    if len(archive) > _EDGE:  # read front to back: the guess from the first bytes was right
        assert _guess(archive[:_EDGE], PREFIX) == found
    if name.endswith("over the edge"):
        assert len(archive) > _EDGE


def test_read_stored_follows_the_directory_when_the_first_bytes_mislead(tmp_path: Path) -> None:
    """A stored zip (sizes in its local headers) whose first record named data/0 is a decoy: the
    directory's last entry of that name is the one that counts (as for zipfile). The guess
    from the first bytes picks the decoy; the directory overrules it and the right bytes are read."""
    tensor = torch.arange(3000, dtype=torch.float32)
    genuine = archive_of(tensor)
    with zipfile.ZipFile(io.BytesIO(genuine)) as z:
        records = {i.filename.partition("/")[2]: z.read(i) for i in z.infolist()}
    blob = io.BytesIO()
    with zipfile.ZipFile(blob, "w", zipfile.ZIP_STORED) as z, pytest.warns(UserWarning, match="Duplicate name"):
        z.writestr("archive/data.pkl", records["data.pkl"])
        z.writestr("archive/byteorder", b"little")
        z.writestr("archive/data/0", b"\x00" * len(records["data/0"]))  # the decoy
        z.writestr("archive/data/0", records["data/0"])
    archive = blob.getvalue()
    assert len(archive) > _EDGE
    found, data = read_stored_bytes(tmp_path, archive)
    decoy = _guess(archive[:_EDGE], PREFIX)
    assert decoy is not None and decoy != found
    assert found is not None and found == locate_bytes(tmp_path, archive)
    assert data == records["data/0"]
    assert found.start == PREFIX + archive.rindex(records["data/0"][:64])


def test_read_stored_refuses_an_archive_whose_directory_disagrees(tmp_path: Path) -> None:
    """The first bytes are intact (the guess succeeds and the bytes are read), but the directory
    at the end is damaged: the read is not accepted."""
    archive = bytearray(archive_of(torch.randn(2000)))
    archive[archive.rindex(b"PK\x01\x02") + 1] ^= 0xFF  # the last directory entry's signature
    assert locate_bytes(tmp_path, bytes(archive)) is None
    assert read_stored_bytes(tmp_path, bytes(archive))[0] is None


def test_read_stored_on_a_truncated_file_is_none(tmp_path: Path) -> None:
    archive = archive_of(torch.randn(2000))
    path = tmp_path / "item.distcp"
    path.write_bytes(archive[: len(archive) // 2])  # the item's bytes run past the end of the file
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_stored(fd, 0, len(archive), lambda stored: memoryview(bytearray(stored.nbytes))) is None
    finally:
        os.close(fd)


def test_read_stored_takes_no_buffer_of_the_wrong_size(tmp_path: Path) -> None:
    archive = archive_of(torch.randn(2000))
    path = tmp_path / "item.distcp"
    path.write_bytes(archive)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_stored(fd, 0, len(archive), lambda stored: memoryview(bytearray(stored.nbytes + 4))) is None
        assert read_stored(fd, 0, len(archive), lambda stored: None) is None  # declined
    finally:
        os.close(fd)


BIG_SAMPLE = archive_of(torch.arange(1500, dtype=torch.float32).reshape(30, 50))
# where damage matters: the local headers and data.pkl at the front, the directory at the end
_EDGES = st.one_of(st.integers(0, 600), st.integers(len(BIG_SAMPLE) - 600, len(BIG_SAMPLE) - 1))


@settings(max_examples=300, deadline=None)
@given(flips=st.lists(st.tuples(_EDGES, st.integers(1, 255)), max_size=4), cut=st.integers(0, 40))
def test_a_damaged_archive_read_front_to_back_agrees_with_locate(tmp_path_factory: pytest.TempPathFactory, flips: list[tuple[int, int]], cut: int) -> None:
    damaged = bytearray(BIG_SAMPLE)
    for at, mask in flips:
        damaged[at] ^= mask
    damaged = damaged[: len(damaged) - cut]
    tmp = tmp_path_factory.mktemp("fuzz")
    found, data = read_stored_bytes(tmp, bytes(damaged))
    assert found == locate_bytes(tmp, bytes(damaged))
    if found is not None:
        assert PREFIX <= found.start and found.start + found.nbytes <= PREFIX + len(damaged)
        assert data == bytes(damaged[found.start - PREFIX : found.start - PREFIX + found.nbytes])


def test_a_directory_zipfile_refuses_is_no_answer_not_an_error(tmp_path: Path) -> None:
    """zipfile raises NotImplementedError (not BadZipFile) for an entry that needs a newer zip
    version than it reads: the item goes to DCP's loader like any archive the parser does not take."""
    archive = bytearray(archive_of(torch.randn(5, 3)))
    entry = archive.index(b"PK\x01\x02")
    archive[entry + 6 : entry + 8] = (64).to_bytes(2, "little")  # version needed to extract: 6.4
    assert locate_bytes(tmp_path, bytes(archive)) is None
    fd = os.open(tmp_path / "item.distcp", os.O_RDONLY)
    try:
        assert read_stored(fd, PREFIX, len(archive), lambda stored: memoryview(bytearray(stored.nbytes))) is None
    finally:
        os.close(fd)
