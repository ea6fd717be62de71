"""Where a `torch.save` archive keeps its tensor's bytes, found without torch.

DCP stores each tensor chunk as a `torch.save` archive: a zip file of uncompressed
records, `<name>/data.pkl` (a small pickle that rebuilds the tensor) and
`<name>/data/<key>` (the storage's raw bytes). `locate` reads the zip directory with
`zipfile`, the record's local header for where its bytes start, and `data.pkl` with a
restricted unpickler that accepts nothing but the tensor-rebuild call and the storage
class names (no code in the file runs). The result is the byte offset, dtype and shape of
a plain little-endian contiguous tensor, or None for anything else; callers then leave the
item to DCP's own loader.

The converter (`_dcp_stream`, no torch) and resume's direct reader (`_dcp_direct`) use it.
"""

from __future__ import annotations

import collections
import io
import math
import os
import pickle
import struct
import zipfile
from dataclasses import dataclass
from typing import Any

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
_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")  # a zip local file header, 30 bytes


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


class _Slice(io.RawIOBase):
    """A read-only window `[start, start + length)` of an open file descriptor."""

    def __init__(self, fd: int, start: int, length: int) -> None:
        self._fd, self._start, self._length, self._pos = fd, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._length - self._pos))
        got = os.preadv(self._fd, [view[:n]], self._start + self._pos) if n else 0
        self._pos += got
        return got


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


def _records(archive: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    """Records by their name below the archive's one top-level folder."""
    out = {}
    for info in archive.infolist():
        top, _, rest = info.filename.partition("/")
        if top and rest:
            out[rest] = info
    return out


def _data_start(fd: int, start: int, info: zipfile.ZipInfo) -> int | None:
    """Offset, from the archive's start at `start`, of a stored (uncompressed) record's bytes."""
    if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
        return None
    head = os.pread(fd, _LOCAL_HEADER.size, start + info.header_offset)
    if len(head) != _LOCAL_HEADER.size:
        return None
    fields = _LOCAL_HEADER.unpack(head)
    if fields[0] != b"PK\x03\x04":
        return None
    return int(info.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10])


def locate(fd: int, start: int, length: int) -> Stored | None:
    """Where the tensor bytes of the `torch.save` archive at `[start, start + length)` of the
    open file `fd` are, or None when it is not a plain little-endian contiguous tensor archive."""
    try:
        with zipfile.ZipFile(io.BufferedReader(_Slice(fd, start, length))) as archive:
            records = _records(archive)
            if "byteorder" in records and archive.read(records["byteorder"]) != b"little":
                return None
            if "data.pkl" not in records or records["data.pkl"].file_size > 1 << 20:
                return None
            meta = _TensorMetaUnpickler(io.BytesIO(archive.read(records["data.pkl"]))).load()
            if not isinstance(meta, _Rebuilt) or len(meta.storage) < 3 or meta.storage[0] != "storage":
                return None
            kind, key = meta.storage[1], str(meta.storage[2])
            if not isinstance(kind, _Storage) or meta.stride != _contiguous_strides(meta.shape):
                return None
            record = records.get(f"data/{key}")
            size = itemsize(kind.dtype)
            if record is None or (meta.offset + math.prod(meta.shape)) * size > record.file_size:
                return None
            begin = _data_start(fd, start, record)
        if begin is None:
            return None
        begin += meta.offset * size
        if begin + math.prod(meta.shape) * size > length:
            return None
        return Stored(start=start + begin, dtype=kind.dtype, shape=meta.shape)
    except (zipfile.BadZipFile, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, KeyError, IndexError, OSError, struct.error):
        return None
