"""Write a safetensors file from its data section, streamed in pieces (no torch).

The header is built from `TensorSpec`s first, then the caller's pieces are appended, so
memory holds what the caller holds (one tensor for the savers, a few reused buffers for the
converter). The file is written under a temporary name, its SHA-256 and CRC-32 computed
from the bytes as they go out, fsynced, read back by safetensors itself (names and shapes),
then renamed into place. `_formats.safetensors.write` feeds it tensors; the converter feeds it
shard bytes.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from safetensors import safe_open

from lr_config import CheckpointError, FileDigest
from lr_config.st_format import TensorSpec, build_header

from ..._io.direct_io import DirectWriter
from ..._io.hashing import StreamHasher

__all__ = ["check_readable", "write_safetensors_body"]


def _write_body(sink: DirectWriter, body: Iterable[memoryview], hasher: StreamHasher) -> int:
    written = 0
    for data in body:
        hasher.update(data)  # hashed beside the write; `data` stays alive until the next update
        sink.write(data)
        written += len(data)
    return written


def check_readable(path: Path, specs: Sequence[TensorSpec]) -> None:
    """Open `path` with safetensors itself and check every promised name, dtype and shape."""
    try:
        with safe_open(str(path), framework="numpy") as f:  # names and shapes only: no torch needed
            names = set(f.keys())
            for spec in specs:
                if spec.name not in names:
                    raise CheckpointError(f"{path}: tensor {spec.name!r} missing after writing")
                shape = tuple(f.get_slice(spec.name).get_shape())
                if shape != spec.shape:
                    raise CheckpointError(f"{path}: tensor {spec.name!r} has shape {shape}, expected {spec.shape}")
    except CheckpointError:
        raise
    except Exception as exc:  # safetensors raises its own error types for damaged files
        raise CheckpointError(f"{path}: safetensors cannot read the file back ({exc})") from None


def write_safetensors_body(
    path: Path,
    specs: Sequence[TensorSpec],
    body: Iterable[memoryview],
    metadata: Mapping[str, str] | None = None,
    *,
    direct: bool = False,
    before_rename: Callable[[Path], None] | None = None,
) -> FileDigest:
    """`write_safetensors` for a caller that yields the data section itself: the bytes of every
    tensor of `specs`, in order, in pieces of any size. A piece is hashed while the next one is
    made, so its memory must stay unchanged until the piece after the next is requested (a
    caller may reuse it then). The total must be what the header promised; safetensors then
    reads the file back (names, shapes) before it is renamed into place. `direct` writes
    with O_DIRECT where the filesystem takes it (`_io.direct_io`). `before_rename(tmp)` runs on the
    complete file under its temporary name: whatever it raises leaves `path` as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        open(tmp, "xb").close()  # plain open: the file gets the umask's mode
        sink = DirectWriter(tmp, direct=direct)
        try:
            with StreamHasher() as hasher:
                header = build_header(specs, dict(metadata) if metadata else None)
                hasher.update(header)
                sink.write(header)
                written = _write_body(sink, body, hasher)
                promised = sum(spec.nbytes for spec in specs)
                if written != promised:
                    raise RuntimeError(f"safetensors writer: {written} data bytes, the header promised {promised}")
                digest = hasher.digest()
            sink.finish()
        finally:
            sink.close()
        check_readable(tmp, specs)
        if before_rename is not None:
            before_rename(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return digest
