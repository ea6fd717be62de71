"""Where a `torch.save` archive keeps its tensor's bytes, found without torch.

DCP stores each tensor chunk as a `torch.save` archive: a zip file of uncompressed
records, `<name>/data.pkl` (a small pickle that rebuilds the tensor) and
`<name>/data/<key>` (the storage's raw bytes). `locate` parses the zip structures it needs
itself, from the archive's first and last 4 KiB (two reads, which hold the whole directory,
`data.pkl`, `byteorder` and the local headers in torch's archives; anything elsewhere is
read where it is): the end-of-directory record (zip64 too), the directory, each record's
local header for where its bytes start, and `data.pkl` with a restricted unpickler that
accepts nothing but the tensor-rebuild call and the storage class names (no code in the
file runs). The records it reads whole (`byteorder`, `data.pkl`) must match their CRC-32.
The result is the byte offset, dtype and shape of a plain little-endian contiguous tensor,
or None for anything else (an archive it does not recognise included); callers then leave
the item to DCP's own loader, which is slower but takes any archive torch writes.

Why not `zipfile`: a resume locates every stored chunk, about a hundred per rank for the
benchmark's model. With `zipfile` (its directory parse and two `ZipExtFile` reads through a
buffered window of the file) that took 148 us per chunk, 14 ms of a 0.22 s two-rank load
from the page cache; this parse takes 45 us (BENCHMARKS.md, notes of the seventh session).

The converter (`_dcp_stream`, no torch) and resume's direct reader (`_dcp_direct`) use it.
"""

from __future__ import annotations

import collections
import io
import math
import os
import pickle
import struct
import zlib
from dataclasses import dataclass
from typing import Any, NamedTuple

from ._st_format import byte_size, itemsize

__all__ = ["Stored", "locate"]

# torch's legacy storage class names, which data.pkl uses for the dtype
_STORAGE_DTYPES = {
    "DoubleStorage": "float64",
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
}
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # a zip local file header, 30 bytes
_CENTRAL = struct.Struct("<4s6H3L5H2L")  # a central directory entry, 46 bytes
_EOCD = struct.Struct("<4s4H2LH")  # the end-of-central-directory record, 22 bytes
_ZIP64_LOCATOR = struct.Struct("<4sLQL")  # 20 bytes, just before the end-of-directory record
_ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")  # the zip64 end-of-directory record, 56 bytes
_SATURATED = 0xFFFFFFFF  # a 32-bit field whose value is in the zip64 extra field
_EDGE = 4 << 10  # bytes read at each end of an archive
_MAX_DIRECTORY = 1 << 20


@dataclass(frozen=True)
class Stored:
    """Where a stored tensor's bytes are in the file, and what they are (dtype name as
    torch spells it, without `torch.`)."""

    start: int
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return byte_size(self.dtype, self.shape)


@dataclass(frozen=True)
class _Storage:
    dtype: str


@dataclass(frozen=True)
class _Rebuilt:
    storage: tuple[Any, ...]
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild(storage: Any, offset: Any, size: Any, stride: Any, *_: Any) -> _Rebuilt:
    return _Rebuilt(storage=tuple(storage), offset=int(offset), shape=tuple(int(s) for s in size), stride=tuple(int(s) for s in stride))


class _TensorMetaUnpickler(pickle.Unpickler):
    """Reads a `torch.save(tensor)` data.pkl into `_Rebuilt`; refuses any other global."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch" and name in _STORAGE_DTYPES:
            return _Storage(_STORAGE_DTYPES[name])  # the storage class stands for its dtype
        raise pickle.UnpicklingError(f"unexpected {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        return pid


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


class _NotPlain(Exception):
    """The archive is not one this parser takes (the item goes to DCP's own loader)."""


class _Record(NamedTuple):
    """A directory entry: its whole name, compression method, CRC-32, sizes (stored and
    uncompressed) and its local header's offset from the archive's start."""

    name: bytes
    method: int
    crc: int
    size: int
    file_size: int
    header: int


class _Archive:
    """The archive `[start, start + length)` of the open file `fd`, read through `read`: its
    first and last `_EDGE` bytes are read once, anything else where it is asked for."""

    def __init__(self, fd: int, start: int, length: int) -> None:
        self.fd, self.start, self.length = fd, start, length
        self.head = os.pread(fd, min(length, _EDGE), start)
        self.tail_at = max(0, length - _EDGE)
        # an archive of at most `_EDGE` bytes (a scalar's, most of them) is its own tail
        self.tail = self.head if self.tail_at == 0 else os.pread(fd, length - self.tail_at, start + self.tail_at)
        if len(self.head) != min(length, _EDGE) or len(self.tail) != length - self.tail_at:
            raise _NotPlain("the file is shorter than the item")

    def read(self, offset: int, count: int) -> bytes:
        if offset < 0 or count < 0 or offset + count > self.length:
            raise _NotPlain("a record points outside the item")
        if offset + count <= len(self.head):
            return self.head[offset : offset + count]
        if offset >= self.tail_at:
            return self.tail[offset - self.tail_at : offset - self.tail_at + count]
        got = os.pread(self.fd, count, self.start + offset)
        if len(got) != count:
            raise _NotPlain("the file is shorter than the item")
        return got


def _directory(archive: _Archive) -> tuple[int, int, int]:
    """(entries, offset, size) of the central directory, from the end-of-directory record (or
    its zip64 twin where a field is saturated). An archive comment or several disks: not ours."""
    end = archive.length - _EOCD.size
    sig, disk, dir_disk, here, entries, size, offset, comment = _EOCD.unpack(archive.read(end, _EOCD.size))
    if sig != b"PK\x05\x06" or comment or disk or dir_disk or here != entries:
        raise _NotPlain("no end-of-directory record at the end")
    if _SATURATED in (size, offset) or entries == 0xFFFF:
        sig, _, at, disks = _ZIP64_LOCATOR.unpack(archive.read(end - _ZIP64_LOCATOR.size, _ZIP64_LOCATOR.size))
        if sig != b"PK\x06\x07" or disks > 1:
            raise _NotPlain("no zip64 locator")
        sig, _, _, _, disk, dir_disk, here, entries, size, offset = _ZIP64_EOCD.unpack(archive.read(at, _ZIP64_EOCD.size))
        if sig != b"PK\x06\x06" or disk or dir_disk or here != entries:
            raise _NotPlain("no zip64 end-of-directory record")
    return entries, offset, size


def _zip64_fields(extra: bytes, file_size: int, size: int, header: int) -> tuple[int, int, int]:
    """The sizes and header offset of an entry, from its zip64 extra field where the 32-bit
    ones are saturated (the field holds, in that order, only the saturated ones)."""
    saturated = [value == _SATURATED for value in (file_size, size, header)]
    at = 0
    while at + 4 <= len(extra):
        tag, length = struct.unpack_from("<2H", extra, at)
        body = extra[at + 4 : at + 4 + length]
        at += 4 + length
        if tag != 1:
            continue
        if len(body) < 8 * sum(saturated):
            break
        wide = iter(struct.unpack_from(f"<{sum(saturated)}Q", body))
        file_size, size, header = (next(wide) if s else v for s, v in zip(saturated, (file_size, size, header)))
        return file_size, size, header
    raise _NotPlain("a saturated size without its zip64 field")


def _records(archive: _Archive) -> dict[bytes, _Record]:
    """Records by their name below the archive's one top-level folder (the last entry of a
    name wins, as with zipfile)."""
    entries, offset, directory_size = _directory(archive)
    if directory_size > _MAX_DIRECTORY:
        raise _NotPlain("the directory is too big for a tensor archive")
    data = archive.read(offset, directory_size)
    out = {}
    at = 0
    for _ in range(entries):
        if at + _CENTRAL.size > len(data):
            raise _NotPlain("the directory is cut short")
        sig, _, _, flags, method, _, _, crc, size, file_size, name_len, extra_len, comment_len, _, _, _, header = _CENTRAL.unpack_from(data, at)
        begin = at + _CENTRAL.size
        name = data[begin : begin + name_len]
        at = begin + name_len + extra_len + comment_len
        if sig != b"PK\x01\x02" or at > len(data) or flags & 0x1:  # bit 0: encrypted
            raise _NotPlain("a bad directory entry")
        if _SATURATED in (file_size, size, header):
            file_size, size, header = _zip64_fields(data[begin + name_len : begin + name_len + extra_len], file_size, size, header)
        top, _, rest = name.partition(b"/")
        if top and rest:
            out[rest] = _Record(name, method, crc, size, file_size, header)
    return out


def _data_start(archive: _Archive, record: _Record) -> int:
    """Offset, from the archive's start, of a stored (uncompressed) record's bytes."""
    if record.method != 0 or record.size != record.file_size:
        raise _NotPlain("a compressed record")
    fields = _LOCAL_HEADER.unpack(archive.read(record.header, _LOCAL_HEADER.size))
    if fields[0] != b"PK\x03\x04" or archive.read(record.header + _LOCAL_HEADER.size, fields[9]) != record.name:
        raise _NotPlain("a local header that does not match the directory")
    return int(record.header + _LOCAL_HEADER.size + fields[9] + fields[10])


def _content(archive: _Archive, record: _Record, limit: int) -> bytes:
    """A small record's bytes, checked against its CRC-32."""
    if record.file_size > limit:
        raise _NotPlain("a record bigger than expected")
    data = archive.read(_data_start(archive, record), record.file_size)
    if zlib.crc32(data) != record.crc:
        raise _NotPlain("a record whose bytes do not match its CRC-32")
    return data


def locate(fd: int, start: int, length: int) -> Stored | None:
    """Where the tensor bytes of the `torch.save` archive at `[start, start + length)` of the
    open file `fd` are, or None when it is not a plain little-endian contiguous tensor archive."""
    try:
        archive = _Archive(fd, start, length)
        records = _records(archive)
        if b"byteorder" in records and _content(archive, records[b"byteorder"], 16) != b"little":
            return None
        if b"data.pkl" not in records:
            return None
        meta = _TensorMetaUnpickler(io.BytesIO(_content(archive, records[b"data.pkl"], 1 << 20))).load()
        if not isinstance(meta, _Rebuilt) or len(meta.storage) < 3 or meta.storage[0] != "storage":
            return None
        kind, key = meta.storage[1], str(meta.storage[2])
        if not isinstance(kind, _Storage) or meta.stride != _contiguous_strides(meta.shape):
            return None
        record = records.get(f"data/{key}".encode())
        size = itemsize(kind.dtype)
        if record is None or (meta.offset + math.prod(meta.shape)) * size > record.file_size:
            return None
        begin = _data_start(archive, record) + meta.offset * size
        if begin + math.prod(meta.shape) * size > length:
            return None
        return Stored(start=start + begin, dtype=kind.dtype, shape=meta.shape)
    except (_NotPlain, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, KeyError, IndexError, OSError, OverflowError, struct.error):
        return None
