"""Checksums of a checkpoint's files: `checksums.json` in the step folder.

Headers and DCP metadata say whether a file parses, not whether its bytes are the ones that
were saved: a flipped bit inside a tensor loads fine. So every save records the size,
SHA-256 and CRC-32 of each file of the step folder. `verify` compares both digests; resume
compares the CRC-32 (zlib-ng's is six times as fast, and what matters at load is catching
flipped and truncated bytes, not an adversary), or the SHA-256 for an entry that has no
CRC-32 (a checksums.json of version 1, before it had one).

- At commit (collective, before the temporary folder is renamed) the main rank lists the
  files and their sizes; the files are split over the ranks by bytes (`_share`), each rank
  hashes its share in threads (hashlib and zlib-ng release the GIL on large buffers, and the
  files were just written, so they are read from the page cache); the main rank writes
  `checksums.json`. It is fsynced and renamed with the rest.
- A file is hashed through read-only memory maps of the page cache, `_WINDOW` bytes at a
  time (`_chunks`), not read into a buffer: the digests read the cached pages where they
  are, without a copy. At resume the hashing runs beside the load on the same cores, and
  the threads that read ahead of the loader are its prefetch; without the copy they cost
  less and run further ahead (two-rank DCP load of the benchmark's checkpoint: what the
  check adds to a load from the page cache, 47 ms -> 33 ms; a cold load, 0.86 -> 0.91 of a
  raw read; BENCHMARKS.md, section 3, has the load ratios). A file system that cannot map
  the file, or a file shorter than its size at open, is read instead. A file truncated while
  its window is mapped would end the process with SIGBUS; lr never truncates a saved file
  (retention and `convert` delete whole files, which leaves an open mapping valid).
- `checksum_problems(step_dir)` (one process, for verify) and `ChecksumCheck(step_dir)`
  (resume: started on every rank before the load so the hashing overlaps it, then
  `finish()`, collective) name each file that is missing, has another size, or another
  digest.

A step folder without `checksums.json` (written by hand or by an older lr) is checked
structurally only. `lr-checkpoint convert` keeps the file true with `update_checksums`: the
`model.safetensors` it writes is added, the DCP shards it deletes are dropped.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from io import FileIO
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from lr_config import CheckpointError, Checksums, ConfigError, FileDigest, load_checksums, save_checksums

from .._ranks import broadcast_value, gather_values, is_main, rank, run_on_main, world_size
from .hashing import crc32, crc32_hex

if TYPE_CHECKING:
    import torch.distributed as dist

__all__ = ["CHECKSUMS", "ChecksumCheck", "checksum_problems", "read_checksums", "update_checksums", "write_checksums"]

CHECKSUMS = "checksums.json"
_THREADS = 4
_BUFFER = 8 << 20
_WINDOW = 32 << 20  # a multiple of mmap.ALLOCATIONGRANULARITY (4 KiB on Linux, 64 KiB on Windows)


def _read_chunks(f: FileIO, offset: int) -> Iterator[memoryview]:
    """The file's bytes from `offset` to its end, read into one reused buffer."""
    buffer = bytearray(_BUFFER)
    view = memoryview(buffer)
    f.seek(offset)
    while got := f.readinto(buffer):
        yield view[:got]


def _chunks(f: FileIO, size: int, window: int) -> Iterator[memoryview]:
    """The first `size` bytes of the open file `f`, as read-only maps of `window` bytes, each
    valid until the next one is asked for; read instead (to its actual end) from the first
    window that cannot be mapped: a file system without mmap, or a file now shorter."""
    sequential = getattr(mmap, "MADV_SEQUENTIAL", None)
    for offset in range(0, size, window):
        try:
            mapped = mmap.mmap(f.fileno(), min(window, size - offset), access=mmap.ACCESS_READ, offset=offset)
        except (OSError, ValueError):  # ValueError: the file no longer reaches offset + window
            yield from _read_chunks(f, offset)
            return
        with mapped:
            if sequential is not None:
                mapped.madvise(sequential)  # the kernel reads ahead of the faults, and further
            view = memoryview(mapped)
            try:
                yield view
            finally:
                view.release()


def _digest(path: Path, sha256: bool = True, window: int = _WINDOW) -> FileDigest:
    """The file's size and CRC-32, and its SHA-256 unless `sha256=False` (`window`: see `_chunks`)."""
    sha = hashlib.sha256() if sha256 else None
    crc = size = 0
    with open(path, "rb", buffering=0) as f:
        for chunk in _chunks(f, os.fstat(f.fileno()).st_size, window):
            if sha is not None:
                sha.update(chunk)
            crc = crc32(chunk, crc)
            size += len(chunk)
    return FileDigest(size=size, sha256=sha.hexdigest() if sha is not None else "", crc32=crc32_hex(crc))


def _needs_sha256(expected: FileDigest | None) -> bool:
    """Resume: the SHA-256 is needed only for an entry without a CRC-32 (version 1)."""
    return expected is None or not expected.crc32


def _digests(root: Path, names: list[str], expected: dict[str, FileDigest] | None = None) -> dict[str, FileDigest]:
    """Digests of `names` in threads: both digests, or (`expected` given, resume) only what
    comparing with `expected` needs."""
    if not names:
        return {}

    def one(name: str) -> FileDigest:
        return _digest(root / name, sha256=expected is None or _needs_sha256(expected.get(name)))

    with ThreadPoolExecutor(max_workers=min(_THREADS, len(names))) as pool:
        return dict(zip(names, pool.map(one, names)))


def _share(sizes: dict[str, int], me: int, ranks: int) -> list[str]:
    """This rank's files to hash: the biggest first, each to the rank with the fewest bytes so
    far (ties: the lowest rank), so that one large optimizer file does not land with others
    on one rank. Every rank computes the same split from the same sizes."""
    loads = [0] * ranks
    mine = []
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        target = min(range(ranks), key=lambda r: (loads[r], r))
        loads[target] += sizes[name]
        if target == me:
            mine.append(name)
    return sorted(mine)


def _listed_files(root: Path) -> dict[str, int]:
    """Every regular file under `root` (relative, `/`-separated, sorted) and its size,
    checksums.json aside."""
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            if path.is_file() and not path.is_symlink():
                found[path.relative_to(root).as_posix()] = path.stat().st_size
    return {n: found[n] for n in sorted(found) if n != CHECKSUMS}


def write_checksums(root: Path, known: dict[str, FileDigest] | None = None, group: dist.ProcessGroup | None = None) -> None:
    """Collective: hash every file of the step folder `root`; the main rank writes checksums.json.
    `known`: digests the main rank took while it wrote those files (by relative name); they
    are not read again. `group`: the process group to use (default: the default group)."""
    sizes: dict[str, int] = _listed_files(root) if is_main() else {}
    done = {name: d for name, d in (known or {}).items() if sizes.get(name) == d.size}
    sizes, skipped = broadcast_value((sizes, set(done)), group)
    todo = _share({name: size for name, size in sizes.items() if name not in skipped}, rank(), world_size())
    parts = gather_values({**done, **_digests(root, todo)}, group)

    def write() -> None:
        merged: dict[str, FileDigest] = {}
        for part in parts or []:
            merged.update(part)
        save_checksums(root / CHECKSUMS, Checksums(files=dict(sorted(merged.items()))))

    run_on_main(write, f"writing {root / CHECKSUMS}", group)


def update_checksums(
    root: Path,
    sums: Checksums | None,
    *,
    written: Mapping[Path, FileDigest] | Iterable[Path] = (),
    removed_folder: Path | None = None,
) -> None:
    """One process: record the digests of `written` files (given, or hashed here) and drop the
    entries under `removed_folder` in the step folder `root`'s checksums.json, whose content
    (`read_checksums`) is `sums`; no-op when it has none."""
    if sums is None:
        return
    files = dict(sums.files)
    if removed_folder is not None:
        prefix = Path(removed_folder).relative_to(root).as_posix() + "/"
        files = {name: d for name, d in files.items() if not name.startswith(prefix)}
    given = written if isinstance(written, Mapping) else {path: _digest(Path(path)) for path in written}
    for path, digest in given.items():
        files[Path(path).relative_to(root).as_posix()] = digest
    save_checksums(root / CHECKSUMS, Checksums(files=dict(sorted(files.items()))))


def _entry_path(root: Path, name: str) -> Path | None:
    """`root / name` for a plain relative name; None for one that would leave the folder."""
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        return None
    return root.joinpath(*pure.parts)


def _size_problems(root: Path, expected: dict[str, FileDigest], names: Iterable[str]) -> tuple[list[str], list[str]]:
    """(problems of names that are missing, outside the folder or of another size; the
    names left to hash)."""
    problems = []
    todo: list[str] = []
    for name in names:
        path = _entry_path(root, name)
        if path is None:
            problems.append(f"{root / CHECKSUMS}: entry {name!r} points outside the checkpoint; the file is damaged")
        elif not path.is_file():
            problems.append(f"{path}: missing; the checkpoint is incomplete")
        elif path.stat().st_size != expected[name].size:
            problems.append(
                f"{path}: {path.stat().st_size} bytes, but {expected[name].size} when it was saved; the file is "
                "truncated or damaged: resume from another checkpoint"
            )
        else:
            todo.append(name)
    return problems, todo


def _shared(expected: FileDigest, got: FileDigest) -> list[tuple[str, str]]:
    """The digests both sides have (`got` always has the CRC-32, and the SHA-256 when
    `expected` has no CRC-32; only an entry with neither, written by hand, shares none)."""
    return [(a, b) for a, b in ((expected.crc32, got.crc32), (expected.sha256, got.sha256)) if a and b]


def _digest_problems(root: Path, expected: dict[str, FileDigest], got: dict[str, FileDigest]) -> list[str]:
    problems = []
    for name, digest in got.items():
        shared = _shared(expected[name], digest)
        if not shared:
            problems.append(f"{root / CHECKSUMS}: entry {name!r} has neither a SHA-256 nor a CRC-32; the file is damaged")
        elif any(a != b for a, b in shared):
            problems.append(
                f"{root / name}: its bytes differ from the save (its checksum does not match {CHECKSUMS}); the file is "
                "damaged: resume from another checkpoint"
            )
    return problems


def _compare(root: Path, expected: dict[str, FileDigest], names: Iterable[str]) -> list[str]:
    problems, todo = _size_problems(root, expected, names)
    return problems + _digest_problems(root, expected, _digests(root, todo))


def read_checksums(root: Path) -> Checksums | None:
    """The step folder `root`'s checksums.json (None when it has none), or CheckpointError."""
    path = root / CHECKSUMS
    if not path.exists():
        return None
    try:
        return load_checksums(path)
    except ConfigError as exc:
        raise CheckpointError(str(exc), problems=exc.problems) from None


def checksum_problems(root: Path, skip: Iterable[Path] = ()) -> list[str]:
    """The files of the step folder `root` that differ from checksums.json (one process).
    Files in `skip` (already reported as unreadable) are not compared again."""
    try:
        sums = read_checksums(root)
    except CheckpointError as exc:
        return exc.problems if len(exc.problems) > 1 else [str(exc)]
    if sums is None:
        return []
    skipped = {Path(p) for p in skip}
    names = [n for n in sorted(sums.files) if (_entry_path(root, n) or root) not in skipped]
    return _compare(root, sums.files, names)


class ChecksumCheck:
    """Resume's check of a step folder against checksums.json, started before the load.

    Creating it (on every rank, no collective) reads checksums.json, checks this rank's
    share of the files for presence and size, and starts hashing them in background threads
    (hashlib and zlib-ng release the GIL), so the hashing overlaps the load that reads the
    same files and each byte comes from the disk once. The files in `read_by_main` are the
    ones the main rank reads whole and hashes as it reads them (`read_tensors`): they are nobody's
    share, and the loader hands their digests over with `record`. Files and folders in
    `unread` are ones this load does not read (the gathered weights when DCP shards are
    loaded instead, the optimizer's files when it is not loaded): they are left to `verify`.
    `finish()` is collective: it waits for the hashes and raises the same CheckpointError on
    every rank when a file differs. `cancel()` drops the hashing when the load failed first.
    """

    def __init__(self, root: Path, read_by_main: Iterable[Path] = (), unread: Iterable[Path] = ()) -> None:
        self.root = root
        self._failure = ""
        self._expected: dict[str, FileDigest] = {}
        self._problems: list[str] = []
        self._futures: dict[str, Future[FileDigest]] = {}
        self._recorded: dict[str, FileDigest] = {}
        self._by_main: set[str] = set()
        self._pool: ThreadPoolExecutor | None = None
        try:
            sums = read_checksums(root)
        except CheckpointError as exc:
            self._failure = str(exc)
            return
        if sums is None:
            return
        skipped = [Path(p).relative_to(root).as_posix() for p in unread]
        self._expected = {n: d for n, d in sums.files.items() if not any(n == part or n.startswith(part + "/") for part in skipped)}
        self._by_main = {Path(p).relative_to(root).as_posix() for p in read_by_main} & set(self._expected)
        rest = {n: d.size for n, d in self._expected.items() if n not in self._by_main}
        share = _share(rest, rank(), world_size()) + (sorted(self._by_main) if is_main() else [])
        self._problems, todo = _size_problems(root, self._expected, share)
        self._by_main &= set(todo)  # those of another size are reported already
        todo = [n for n in todo if n not in self._by_main]
        if todo:
            self._pool = ThreadPoolExecutor(max_workers=min(_THREADS, len(todo)), thread_name_prefix="lr-checksums")
            self._futures = {name: self._pool.submit(_digest, root / name, _needs_sha256(sums.files[name])) for name in todo}

    def needs_sha256(self, path: Path) -> bool:
        """Whether the digest `record` gets for `path` must include the SHA-256 (its entry has
        no CRC-32); False when there is nothing to compare it with."""
        name = Path(path).relative_to(self.root).as_posix()
        return name in self._expected and _needs_sha256(self._expected[name])

    def record(self, path: Path, digest: FileDigest) -> None:
        """The digest of a file of `read_by_main`, taken by the main rank as it read it."""
        self._recorded[Path(path).relative_to(self.root).as_posix()] = digest

    def cancel(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def finish(self) -> None:
        """Collective: raise CheckpointError on every rank when a file differs from checksums.json."""
        mine = list(self._problems)
        try:
            got = {name: future.result() for name, future in self._futures.items()}
            unrecorded = sorted(self._by_main - set(self._recorded)) if is_main() else []
            got.update(_digests(self.root, unrecorded, self._expected))  # read_by_main named a file the loader did not read
            got.update({name: self._recorded[name] for name in self._by_main & set(self._recorded)})
            mine += _digest_problems(self.root, self._expected, got)
        except OSError as exc:
            mine.append(f"{self.root}: cannot read a file to check it ({exc})")
        finally:
            self.cancel()
        everyone = gather_values((self._failure, mine))
        problems: list[str] = broadcast_value(
            sorted({f for f, _ in everyone if f}) + sorted(p for _, part in everyone for p in part) if everyone else []
        )
        if problems:
            raise CheckpointError("\n".join(problems) if len(problems) > 1 else problems[0], problems=problems)
