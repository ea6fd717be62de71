"""A dataset's parquet data files as memory-mapped Arrow, so memory does not grow with the data.

Parquet is compressed: reading it decodes into the process's own memory, once per process and
DataLoader worker. `mapped_table(parquet)` converts a data file once per machine into an
uncompressed Arrow IPC file in lr's cache (`<LR_CACHE_DIR>/arrow/`, named by the parquet
file's path, size and modification time, so an edited or replaced file is converted again),
then maps it: every process reads the same page-cache pages, which the kernel can drop and
read again, and a process holds only what it touches. The conversion streams the parquet
file a row group at a time into a temporary file that is renamed when complete, so two
processes converting at once, or a crash, never leave a half file under the final name.

`MappedColumns` wraps a mapped table for random access by row: fixed-size float vectors as
zero-copy numpy views (one per record batch), image cells as bytes.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from lr_config.datasets import lr_cache_dir

from .errors import DatasetError

__all__ = ["MappedColumns", "arrow_path", "mapped_table"]

_BATCH_ROWS = 65536


def arrow_path(parquet: Path) -> Path:
    """Where the mapped copy of `parquet` lives (a function of its path, size and mtime)."""
    st = parquet.stat()
    key = hashlib.sha256(f"{parquet.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:32]
    return lr_cache_dir() / "arrow" / f"{key}.arrow"


def _convert(parquet: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        source = pq.ParquetFile(parquet)
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, source.schema_arrow) as writer:
            for batch in source.iter_batches(batch_size=_BATCH_ROWS):
                writer.write_batch(batch)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def mapped_table(parquet: Path) -> pa.Table:
    """The data file as a memory-mapped Arrow table (converted on first use; see the module docstring)."""
    if not parquet.exists():
        raise DatasetError(f"{parquet}: data file missing (listed in meta/episodes)")
    target = arrow_path(parquet)
    try:
        if not target.exists():
            _convert(parquet, target)
        return pa.ipc.open_file(pa.memory_map(str(target), "r")).read_all()
    except OSError as exc:
        if isinstance(exc, (FileNotFoundError, PermissionError)) and not parquet.exists():
            raise DatasetError(f"{parquet}: data file missing (listed in meta/episodes)") from None
        raise DatasetError(
            f"{parquet}: cannot read parquet ({exc}); re-download the dataset, or if the file is fine, check that "
            f"{target.parent} (LR_CACHE_DIR) is writable"
        ) from None
    except Exception as exc:  # pyarrow raises many types for corrupt files
        raise DatasetError(f"{parquet}: cannot read parquet ({exc})") from None


class MappedColumns:
    """Row access to a mapped table's columns (vectors as numpy views, images as bytes)."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self.rows = table.num_rows
        self.column_names = set(table.column_names)
        lengths = [len(chunk) for chunk in table.column(0).chunks] if table.num_columns else []
        self.starts = np.cumsum([0, *lengths])
        self._views: dict[str, list[Any]] = {}

    def _chunks(self, key: str) -> list[Any]:
        if key not in self._views:
            self._views[key] = [_view(chunk) for chunk in self.table.column(key).chunks]
        return self._views[key]

    def _locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        chunk = np.searchsorted(self.starts, rows, side="right") - 1
        return chunk, rows - self.starts[chunk]

    def values(self, key: str, rows: np.ndarray) -> np.ndarray:
        """The column's values at `rows` (a copy): (len(rows), width) for vectors, (len(rows),) for scalars."""
        chunks = self._chunks(key)
        chunk, local = self._locate(rows)
        if (chunk == chunk[0]).all():
            return np.array(chunks[int(chunk[0])][local])
        return np.stack([chunks[c][i] for c, i in zip(chunk.tolist(), local.tolist())])

    def column(self, key: str) -> np.ndarray:
        """The whole column (vectors: (rows, width)); a view when the table is one batch."""
        chunks = self._chunks(key)
        return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)

    def cell_bytes(self, key: str, row: int) -> bytes:
        """The `bytes` of an image cell (LeRobot stores images as struct<bytes, path>)."""
        chunk, local = self._locate(np.asarray([row]))
        cell = self.table.column(key).chunk(int(chunk[0]))[int(local[0])].as_py()
        return bytes(cell["bytes"] if isinstance(cell, dict) else cell)


def _view(chunk: Any) -> Any:
    """A zero-copy numpy view of a chunk: fixed-size lists as (rows, width), plain numbers as (rows,)."""
    if pa.types.is_fixed_size_list(chunk.type):
        width = chunk.type.list_size
        flat = chunk.flatten()  # honours the chunk's offset
        return flat.to_numpy(zero_copy_only=False).reshape(len(chunk), width)
    if pa.types.is_list(chunk.type) or pa.types.is_large_list(chunk.type):
        # variable-size lists (some writers use them for vectors): rows of equal width expected
        flat = chunk.flatten().to_numpy(zero_copy_only=False)
        return flat.reshape(len(chunk), -1) if len(chunk) else flat.reshape(0, 0)
    if pa.types.is_struct(chunk.type) or pa.types.is_binary(chunk.type) or pa.types.is_string(chunk.type):
        return chunk
    return chunk.to_numpy(zero_copy_only=False)
