"""Read a DCP `.metadata` file without trusting it and without importing torch.

DCP stores its index as a pickle. Unpickling runs whatever the file names, so before any
code (ours or DCP's) reads a `.metadata`, this module parses it with an unpickler that
only resolves the handful of DCP and torch names such a file legitimately holds, each
mapped to an inert stand-in. Anything else (a foreign global, a broken stream) makes it
"not a DCP metadata file". The result is plain data: every entry's dtype and global
shape, its chunks (offsets and sizes), and the byte range in the shard file that holds each
chunk.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lr_config import CheckpointError
from lr_config.st_format import DTYPE_CODES, byte_size

__all__ = ["DcpChunk", "DcpMetadata", "DcpStorage", "DcpTensor", "read_dcp_metadata", "read_whole_dcp_metadata", "shard_problems"]

METADATA_FILE = ".metadata"


class _Record:
    """Inert stand-in for a DCP dataclass: accepts any pickled attribute state."""

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:
            state = {**(state[0] or {}), **(state[1] or {})}
        if not isinstance(state, dict):
            raise pickle.UnpicklingError("unexpected object state")
        self.__dict__.update(state)


class _TensorProperties(_Record):
    """DCP pickles TensorProperties as a tuple whose first item is the dtype."""

    _FIELDS = ("dtype", "layout", "requires_grad", "memory_format", "pin_memory", "strides")

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple):
            state = dict(zip(self._FIELDS, state))
        super().__setstate__(state)


def _record_class(name: str) -> type[_Record]:
    return _TensorProperties if name == "TensorProperties" else type(name, (_Record,), {})


_DCP_RECORDS = (
    "Metadata",
    "TensorStorageMetadata",
    "BytesStorageMetadata",
    "TensorProperties",
    "ChunkStorageMetadata",
    "MetadataIndex",
    "StorageMeta",
)
_RECORDS: dict[tuple[str, str], type[_Record]] = {
    **{("torch.distributed.checkpoint.metadata", n): _record_class(n) for n in _DCP_RECORDS},
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _record_class("_StorageInfo"),
}


@dataclass(frozen=True)
class _DType:
    name: str


def _size(values: Any = ()) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _layout(name: Any) -> str:
    return str(name)


def _mem_format(value: Any) -> int:
    return int(value)


def _path(*parts: Any) -> str:
    return "/".join(str(p) for p in parts)


_FUNCTIONS: dict[tuple[str, str], Any] = {
    ("torch", "Size"): _size,
    ("torch.serialization", "_get_layout"): _layout,
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"): _mem_format,
    ("pathlib", "PosixPath"): _path,
    ("pathlib", "WindowsPath"): _path,
    ("pathlib", "PurePosixPath"): _path,
    ("collections", "OrderedDict"): dict,
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _RECORDS:
            return _RECORDS[(module, name)]
        if (module, name) in _FUNCTIONS:
            return _FUNCTIONS[(module, name)]
        if module == "torch" and name in DTYPE_CODES:
            return _DType(name)
        raise _UnknownClass(f"{module}.{name}")


class _UnknownClass(pickle.UnpicklingError):
    """A class outside the restricted reader's whitelist (its argument: the dotted name)."""


@dataclass(frozen=True)
class DcpChunk:
    """One saved piece of a tensor: where it starts in the whole tensor, and its size."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


@dataclass(frozen=True)
class DcpTensor:
    """One tensor entry: torch dtype name, global shape and the chunks it was saved as."""

    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[DcpChunk, ...] = ()

    @property
    def nbytes(self) -> int:
        return byte_size(self.dtype, self.shape)


@dataclass(frozen=True)
class DcpStorage:
    """Where one saved chunk lives: shard file (relative), byte offset and length; the chunk's
    offsets in its tensor; whether DCP transformed the bytes (compression, ...)."""

    key: str
    relative_path: str
    offset: int
    length: int
    chunk_offsets: tuple[int, ...] = ()
    transformed: bool = False


@dataclass
class DcpMetadata:
    """Plain-data view of a DCP checkpoint's index."""

    folder: Path
    tensors: dict[str, DcpTensor] = field(default_factory=dict)
    non_tensors: list[str] = field(default_factory=list)
    storage: list[DcpStorage] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def shard_files(self) -> list[str]:
        return sorted({s.relative_path for s in self.storage})


def _not_dcp(path: Path, why: str) -> CheckpointError:
    return CheckpointError(
        f"{path}: not a valid DCP metadata file ({why}); the checkpoint is damaged or was not "
        f"written by torch.distributed.checkpoint. It was not loaded; re-create it from a good save"
    )


def _entry(path: Path, key: str, value: Any) -> DcpTensor | None:
    kind = type(value).__name__
    if kind == "BytesStorageMetadata":
        return None
    props = getattr(value, "properties", None)
    dtype = getattr(props, "dtype", None)
    size = getattr(value, "size", None)
    if kind != "TensorStorageMetadata" or not isinstance(dtype, _DType) or not isinstance(size, tuple):
        raise _not_dcp(path, f"entry {key!r} is not a tensor description")
    chunks = []
    for chunk in getattr(value, "chunks", None) or ():
        offsets, sizes = getattr(chunk, "offsets", None), getattr(chunk, "sizes", None)
        if not isinstance(offsets, tuple) or not isinstance(sizes, tuple) or len(offsets) != len(size) or len(sizes) != len(size):
            raise _not_dcp(path, f"entry {key!r} has a chunk without offsets and sizes of its rank")
        chunks.append(DcpChunk(offsets=offsets, sizes=sizes))
    return DcpTensor(dtype=dtype.name, shape=size, chunks=tuple(chunks))


def _storage(path: Path, index: Any, info: Any) -> DcpStorage:
    rel, offset, length = (getattr(info, a, None) for a in ("relative_path", "offset", "length"))
    key, chunk_offsets = getattr(index, "fqn", None), getattr(index, "offset", None)
    if not isinstance(rel, str) or not isinstance(offset, int) or not isinstance(length, int) or not isinstance(key, str):
        raise _not_dcp(path, "storage entry without file, offset and length")
    if "/" in rel or "\\" in rel or rel.startswith("."):
        raise _not_dcp(path, f"storage entry points outside its folder ({rel!r})")
    transformed = bool(getattr(info, "transform_descriptors", None))
    offsets = chunk_offsets if isinstance(chunk_offsets, tuple) else ()
    return DcpStorage(key=key, relative_path=rel, offset=offset, length=length, chunk_offsets=offsets, transformed=transformed)


def _unpickle(path: Path) -> Any:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found; the DCP folder is incomplete") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc})") from None
    try:
        return _RestrictedUnpickler(io.BytesIO(raw)).load()
    except _UnknownClass as exc:
        raise CheckpointError(
            f"{path}: not a valid DCP metadata file (refers to {exc.args[0]}, a class lr's restricted reader does not know; "
            "it never falls back to pickle, since a checkpoint may come from anyone). It reads what torch "
            f"{_torch_version()} and the other supported torch versions write: a checkpoint saved by a newer torch needs "
            "a newer lr; otherwise the file is damaged or hostile. It was not loaded"
        ) from None
    except Exception as exc:  # any failure of a hostile or truncated stream means the same
        raise _not_dcp(path, str(exc) or type(exc).__name__) from None


def _torch_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "(not installed)"


def read_dcp_metadata(folder: Path) -> DcpMetadata:
    """Safely parse `folder/.metadata` into a `DcpMetadata`, or raise `CheckpointError`."""
    path = Path(folder) / METADATA_FILE
    root = _unpickle(path)
    entries = getattr(root, "state_dict_metadata", None)
    storage = getattr(root, "storage_data", None)
    if type(root).__name__ != "Metadata" or not isinstance(entries, dict) or not isinstance(storage, dict):
        raise _not_dcp(path, "no Metadata object at its root")
    meta = DcpMetadata(folder=Path(folder))
    for key, value in entries.items():
        tensor = _entry(path, str(key), value)
        if tensor is None:
            meta.non_tensors.append(str(key))
        else:
            meta.tensors[str(key)] = tensor
    meta.storage = [_storage(path, index, info) for index, info in storage.items()]
    return meta


def shard_problems(meta: DcpMetadata) -> list[str]:
    """Shard files the metadata names that are missing or shorter than promised."""
    needed: dict[str, int] = {}
    for item in meta.storage:
        needed[item.relative_path] = max(needed.get(item.relative_path, 0), item.offset + item.length)
    problems = []
    for name, need in sorted(needed.items()):
        path = meta.folder / name
        if not path.is_file():
            problems.append(f"{path}: shard file missing (the DCP metadata refers to it); the checkpoint is incomplete")
        elif path.stat().st_size < need:
            problems.append(f"{path}: truncated shard ({path.stat().st_size} bytes, the metadata needs {need}); the save was interrupted or the copy is incomplete")
    stored = {item.key for item in meta.storage}
    unstored = sorted(set(meta.tensors) - stored)
    if unstored:
        problems.append(f"{meta.folder / METADATA_FILE}: no data stored for {', '.join(unstored[:5])}")
    return problems


def read_whole_dcp_metadata(folder: Path) -> DcpMetadata:
    """`read_dcp_metadata`, then refuse pickled entries and missing or short shard files."""
    meta = read_dcp_metadata(folder)
    if meta.non_tensors:
        raise CheckpointError(
            f"{folder}: holds non-tensor (pickled) entries {meta.non_tensors[:5]}; lr never writes these and will not unpickle them"
        )
    problems = shard_problems(meta)
    if problems:
        raise CheckpointError(problems[0] if len(problems) == 1 else "\n".join(problems), problems=problems)
    return meta
