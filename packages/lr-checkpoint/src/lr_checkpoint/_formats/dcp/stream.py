"""The converter's reader: a DCP folder's tensors as the data section of a safetensors file.

FSDP2 and HSDP shard every tensor along dim 0, so a tensor of lr's DCP folders is saved as
row blocks; laid end to end in row order, the blocks' bytes are the whole tensor's bytes,
which is what safetensors stores. So the converter does not rebuild tensors: it copies byte
ranges of the shard files (each block's bytes inside its `torch.save` record, found by
`_formats.torch_save.locate`) into reused buffers, casting them on the way when the export dtype
differs, and hands those buffers to the writer. A read runs in a worker thread one buffer
ahead of the writer, so reading the shards (from the disk, for a checkpoint written earlier)
overlaps writing and hashing the output.

The shards are read through the page cache, not with `O_DIRECT` as the output is written
(`_io.direct_io`): a conversion right after training finds the shards it reads in memory,
where a direct read goes to the disk again. Measured with `tools/bench/converter.py`'s
checkpoint (201 MB), fresh processes alternated, medians: the conversion took 0.36 s
buffered against 0.59 s direct with the shards in the page cache (8 pairs), and 0.61
against 0.64 s with them dropped from it (10 pairs).

None of this imports torch (`_formats.torch_save` finds the bytes, `_formats.cast` casts
them), so `lr-checkpoint convert` runs without torch's 3 s and 600 MB import. A tensor
stored any other way (chunks along another dim, DCP storage transforms, a record this
reader does not recognise) is loaded whole through DCP (`load_dcp_tensor`, which imports
torch), then cast.
"""

from __future__ import annotations

import collections
import math
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from lr_config.st_format import TensorSpec, itemsize

from ..._io.direct_io import aligned_buffer
from ..cast import FLOATING, cast_into
from ..fast_paths import enabled as fast_paths_enabled, fell_back
from ..torch_save import locate
from .metadata import DcpChunk, DcpMetadata, DcpStorage

__all__ = ["dcp_safetensors_body"]

BUFFER_BYTES = 8 << 20  # three of these (one being read, one written, one still hashed)


@dataclass(frozen=True)
class _Range:
    """`count` elements of dtype `source` at byte `start` of a shard file, written as `target`."""

    path: Path
    start: int
    count: int
    source: str
    target: str

    def nbytes(self, dtype: str) -> int:
        return self.count * itemsize(dtype)


@dataclass(frozen=True)
class _Whole:
    """A tensor read through DCP, cast to `target`."""

    key: str
    target: str


_Part = _Range | _Whole


def _row_blocks(meta: DcpMetadata, key: str, stored: list[DcpStorage]) -> list[tuple[DcpStorage, DcpChunk]] | None:
    """The tensor's stored chunks in row order, when they are whole-width row blocks that tile
    it exactly and were stored untransformed; None otherwise."""
    entry = meta.tensors[key]
    by_offsets = {chunk.offsets: chunk for chunk in entry.chunks}
    blocks = []
    for item in stored:
        chunk = by_offsets.get(item.chunk_offsets)
        if item.transformed or chunk is None:
            return None
        blocks.append((item, chunk))
    blocks.sort(key=lambda pair: pair[1].offsets[:1])
    rows = 0
    for _, chunk in blocks:
        if chunk.offsets[1:] != (0,) * (len(entry.shape) - 1) or chunk.sizes[1:] != entry.shape[1:]:
            return None
        if entry.shape and chunk.offsets[0] != rows:
            return None
        rows += chunk.sizes[0] if entry.shape else 1
    whole = entry.shape[0] if entry.shape else 1
    return blocks if rows == whole and (entry.shape or len(blocks) == 1) else None


def _ranges(meta: DcpMetadata, spec: TensorSpec, blocks: list[tuple[DcpStorage, DcpChunk]], fd: Callable[[Path], int]) -> list[_Range] | None:
    """The byte ranges of a tensor's row blocks, or None when a record is not a plain tensor
    of the metadata's dtype and the block's shape (or its dtype cannot be cast here)."""
    ranges = []
    for item, chunk in blocks:
        path = meta.folder / item.relative_path
        found = locate(fd(path), item.offset, item.length)
        if found is None:
            fell_back(path)
            return None
        if found.dtype != meta.tensors[spec.name].dtype or found.shape != chunk.sizes:
            return None
        if found.dtype != spec.dtype and not {found.dtype, spec.dtype} <= set(FLOATING):
            return None
        ranges.append(_Range(path=path, start=found.start, count=math.prod(chunk.sizes), source=found.dtype, target=spec.dtype))
    return ranges


def _plan(meta: DcpMetadata, specs: list[TensorSpec]) -> list[_Part]:
    """What to read, in file order of the output: byte ranges of the shards, or whole tensors."""
    by_key: dict[str, list[DcpStorage]] = collections.defaultdict(list)
    for item in meta.storage:
        by_key[item.key].append(item)
    handles: dict[Path, int] = {}

    def fd(path: Path) -> int:
        if path not in handles:
            handles[path] = os.open(path, os.O_RDONLY)
        return handles[path]

    parts: list[_Part] = []
    try:
        for spec in specs:
            blocks = _row_blocks(meta, spec.name, by_key[spec.name])
            ranges = _ranges(meta, spec, blocks, fd) if blocks is not None and fast_paths_enabled() else None
            parts.extend(ranges if ranges is not None else [_Whole(key=spec.name, target=spec.dtype)])
    finally:
        for handle in handles.values():
            os.close(handle)
    return parts


def _pieces(part: _Part, limit: int) -> Iterator[_Part]:
    """Split a range into reads whose source and cast bytes both fit a buffer of `limit` bytes."""
    if isinstance(part, _Whole):
        yield part
        return
    per = max(1, limit // max(itemsize(part.source), itemsize(part.target)))
    for first in range(0, part.count, per):
        count = min(per, part.count - first)
        yield _Range(part.path, part.start + first * itemsize(part.source), count, part.source, part.target)


class _Files:
    """Positioned reads of byte ranges of files, each file opened once."""

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}

    def read(self, path: Path, start: int, nbytes: int, buffer: memoryview) -> memoryview:
        """The `nbytes` bytes of `path` at `start`, read into the start of `buffer`."""
        if path not in self._fds:
            self._fds[path] = os.open(path, os.O_RDONLY)
        done = 0
        while done < nbytes:
            got = os.preadv(self._fds[path], [buffer[done:nbytes]], start + done)
            if not got:
                raise OSError(f"{path}: ends at byte {start + done}, before the {nbytes} bytes at {start} its metadata promises")
            done += got
        return buffer[:nbytes]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class _Reader:
    """Fills a buffer with one piece (in the worker thread). Bytes that keep their dtype are
    read into the buffer and used where they landed; bytes to cast are read into a scratch
    buffer and cast into the buffer."""

    def __init__(self, meta: DcpMetadata, files: _Files, nbytes: int) -> None:
        self._meta = meta
        self._files = files
        self._scratch = aligned_buffer(nbytes)

    def read(self, piece: _Part, buffer: memoryview) -> memoryview:
        if isinstance(piece, _Whole):
            return _whole_tensor(self._meta, piece)
        raw = self._files.read(piece.path, piece.start, piece.nbytes(piece.source), buffer if piece.source == piece.target else self._scratch)
        if piece.source == piece.target:
            return raw
        out = buffer[: piece.nbytes(piece.target)]
        cast_into(raw, piece.source, piece.target, out)
        return out


def _whole_tensor(meta: DcpMetadata, piece: _Whole) -> memoryview:
    """A tensor through DCP (torch), for the stored layouts the byte copy does not take."""
    import torch

    from .read import load_dcp_tensor
    from ..safetensors.read import memory_of

    tensor = load_dcp_tensor(meta.folder, piece.key, meta.tensors[piece.key])
    return memory_of(tensor.to(getattr(torch, piece.target)).contiguous())


def _read_ahead(pieces: Iterator[_Part], read: Callable[[_Part, memoryview], memoryview], buffers: list[memoryview]) -> Iterator[memoryview]:
    """`read` each piece into a free buffer in a worker thread, one piece ahead of the consumer.

    The writer hashes a piece while it asks for the next one, so the buffer of piece n is
    given back only when piece n + 2 is requested: three buffers keep one read, one write and
    one hash going."""
    free = collections.deque(buffers)
    held: collections.deque[memoryview] = collections.deque()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="lr-convert-read") as pool:
        ahead: collections.deque[tuple[Future[memoryview], memoryview]] = collections.deque()

        def submit() -> None:
            piece = next(pieces, None)
            if piece is not None:
                buffer = free.popleft()
                ahead.append((pool.submit(read, piece, buffer), buffer))

        submit()
        try:
            while ahead:
                if len(held) == 2:
                    free.append(held.popleft())
                submit()
                future, buffer = ahead.popleft()
                view = future.result()
                held.append(buffer)
                yield view
        finally:
            for future, _ in ahead:
                future.cancel()


def dcp_safetensors_body(meta: DcpMetadata, specs: list[TensorSpec], *, buffer_bytes: int = BUFFER_BYTES) -> Iterator[memoryview]:
    """The safetensors data section for `specs` (tensors of `meta`, cast to each spec's dtype),
    in pieces, for `write_safetensors_body`."""
    parts = _plan(meta, specs)
    largest = max((max(p.nbytes(p.source), p.nbytes(p.target)) for p in parts if isinstance(p, _Range)), default=0)
    limit = max(8, min(buffer_bytes, largest))
    files = _Files()
    reader = _Reader(meta, files, limit)
    buffers = [aligned_buffer(limit) for _ in range(3)]
    pieces = (piece for part in parts for piece in _pieces(part, limit))
    try:
        yield from _read_ahead(pieces, reader.read, buffers)
    finally:
        files.close()
