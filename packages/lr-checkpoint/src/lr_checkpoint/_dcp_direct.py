"""A DCP storage reader that reads tensor bytes straight into their destination.

DCP's `FileSystemReader` turns every stored item into a tensor with `torch.load` (a zip
archive inside the shard file), into fresh memory, then copies the needed part into the
destination: two copies and the page faults of new memory for every byte. Each stored item
is a `torch.save` archive whose tensor bytes sit uncompressed in one record. This reader
finds that record from the archive's directory (`PyTorchFileReader`, which reads only the
directory and headers) and its `data.pkl` (a few hundred bytes, read by a restricted
unpickler that accepts nothing but the tensor-rebuild call), then:

- when a read item is a whole stored chunk and its destination a contiguous CPU tensor of
  the same dtype (a resume onto the same layout: every FSDP2 shard, every optimizer
  state), `readinto` the destination's own memory;
- otherwise (resharding, other dtype, another device) it reads the stored chunk into one
  new tensor and copies the needed slice, as DCP does;
- anything else (byte items, storage transforms, an archive it does not recognise) goes to
  DCP's own code, unchanged.

Items are read file by file in offset order. Used by resume (`load_in_place`) and by the
converter and verify (`load_dcp_tensor`).
"""

from __future__ import annotations

import collections
import dataclasses
import io
import math
import os
import pickle
from dataclasses import dataclass
from typing import IO, Any, cast

import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from ._st_read import read_into

__all__ = ["DirectFileSystemReader"]

_STORAGE_DTYPES: dict[str, torch.dtype] = {
    "DoubleStorage": torch.float64,
    "FloatStorage": torch.float32,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
}


class _Slice(io.RawIOBase):
    """A read-only window `[start, start + length)` of an open file."""

    def __init__(self, f: io.RawIOBase, start: int, length: int) -> None:
        self._f, self._start, self._length, self._pos = f, start, length, 0

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
        got = os.preadv(self._f.fileno(), [view[:n]], self._start + self._pos) if n else 0
        self._pos += got
        return got


@dataclass(frozen=True)
class _Stored:
    """Where a stored tensor's bytes are in the shard file, and what they are."""

    start: int
    dtype: torch.dtype
    shape: tuple[int, ...]


@dataclass(frozen=True)
class _Rebuilt:
    storage: tuple[Any, ...]
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild(storage: Any, offset: int, size: Any, stride: Any, *_: Any) -> _Rebuilt:
    return _Rebuilt(storage=tuple(storage), offset=int(offset), shape=tuple(size), stride=tuple(stride))


class _TensorMetaUnpickler(pickle.Unpickler):
    """Reads a `torch.save(tensor)` data.pkl into `_Rebuilt`; refuses any other global."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]  # the storage class stands for its dtype
        raise pickle.UnpicklingError(f"unexpected {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        return pid


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _locate(f: io.RawIOBase, start: int, length: int) -> _Stored | None:
    """The tensor bytes of the `torch.save` archive at `[start, start + length)`, or None when
    it is not a plain little-endian contiguous tensor archive."""
    try:
        archive: Any = torch._C.PyTorchFileReader(cast(IO[bytes], _Slice(f, start, length)))  # stubs lack has_record, get_record_offset
        if archive.has_record("byteorder") and bytes(archive.get_record("byteorder")) != b"little":
            return None
        meta = _TensorMetaUnpickler(io.BytesIO(bytes(archive.get_record("data.pkl")))).load()
        if not isinstance(meta, _Rebuilt) or len(meta.storage) < 3 or meta.storage[0] != "storage":
            return None
        dtype, key = meta.storage[1], str(meta.storage[2])
        if not isinstance(dtype, torch.dtype) or meta.stride != _contiguous_strides(meta.shape):
            return None
        record = f"data/{key}"
        nbytes = math.prod(meta.shape) * dtype.itemsize
        if (meta.offset + math.prod(meta.shape)) * dtype.itemsize > archive.get_record_size(record):
            return None
        begin = archive.get_record_offset(record) + meta.offset * dtype.itemsize
        if begin + nbytes > length:
            return None
        return _Stored(start=start + begin, dtype=dtype, shape=meta.shape)
    except (RuntimeError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError):
        return None


def _narrow(tensor: torch.Tensor, offsets: torch.Size, lengths: torch.Size) -> torch.Tensor:
    for dim, (offset, length) in enumerate(zip(offsets, lengths)):
        if offset != 0 or length != tensor.shape[dim]:
            tensor = tensor.narrow(dim, offset, length)
    return tensor


class DirectFileSystemReader(FileSystemReader):
    """`FileSystemReader` whose tensor reads go straight into the destination (see above)."""

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._stored_sizes = {
            fqn: [tuple(chunk.sizes) for chunk in entry.chunks]
            for fqn, entry in metadata.state_dict_metadata.items()
            if isinstance(entry, TensorStorageMetadata)
        }

    def _read_one(self, f: io.RawIOBase, req: ReadItem, planner: LoadPlanner) -> bool:
        info = self.storage_data[req.storage_index]
        if req.type != LoadItemType.TENSOR or info.transform_descriptors:
            return False
        stored = _locate(f, info.offset, info.length)
        index = req.storage_index.index
        sizes = self._stored_sizes.get(req.storage_index.fqn, [])
        if stored is None or index is None or index >= len(sizes) or stored.shape != sizes[index]:
            return False
        target = planner.resolve_tensor(req).detach()
        if tuple(target.shape) != tuple(req.lengths):
            return False
        whole = all(o == 0 for o in req.storage_offsets) and tuple(req.lengths) == stored.shape
        if whole and target.device.type == "cpu" and target.dtype == stored.dtype and target.is_contiguous():
            read_into(f.fileno(), target, stored.start)
        else:
            chunk = torch.empty(stored.shape, dtype=stored.dtype)
            read_into(f.fileno(), chunk, stored.start)
            target.copy_(_narrow(chunk, req.storage_offsets, req.lengths))
        planner.commit_tensor(req, target)
        return True

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for req in plan.items:
            per_file.setdefault(self.storage_data[req.storage_index].relative_path, []).append(req)
        rest: list[ReadItem] = []
        for relative_path, reqs in per_file.items():
            path = self.fs.concat_path(self.path, relative_path)
            with open(path, "rb", buffering=0) as f:
                for req in sorted(reqs, key=lambda r: self.storage_data[r.storage_index].offset):
                    if not self._read_one(f, req, planner):
                        rest.append(req)
        if rest:
            return super().read_data(dataclasses.replace(plan, items=rest), planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done
