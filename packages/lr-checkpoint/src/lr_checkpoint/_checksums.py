"""Checksums of a checkpoint's files: `checksums.json` in the step folder.

Headers and DCP metadata say whether a file parses, not whether its bytes are the ones that
were saved: a flipped bit inside a tensor loads fine. So every save records the size and
SHA-256 of each file of the step folder, and `verify` and resume compare them.

- At commit (collective, before the temporary folder is renamed) the main rank lists the
  files; each rank hashes every world_size-th of them, in threads (hashlib releases the GIL
  on large buffers, and the files were just written, so they are read from the page cache);
  the main rank writes `checksums.json`. It is fsynced and renamed with the rest.
- `checksum_problems(step_dir)` (one process, for verify) and `check_checksums(step_dir)`
  (collective, for resume, the hashing shared the same way) name each file that is missing,
  has another size, or another SHA-256.

A step folder without `checksums.json` (written by hand or by an older lr) is checked
structurally only. `lr-checkpoint convert` keeps the file true with `update_checksums`: the
`model.safetensors` it writes is added, the DCP shards it deletes are dropped.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath

from lr_config import Checksums, ConfigError, FileDigest, load_checksums, save_checksums

from ._dist import broadcast_value, gather_values, is_main, rank, run_on_main, world_size
from ._errors import CheckpointError

__all__ = ["CHECKSUMS", "check_checksums", "checksum_problems", "update_checksums", "write_checksums"]

CHECKSUMS = "checksums.json"
_THREADS = 4


def _digest(path: Path) -> FileDigest:
    with open(path, "rb") as f:
        sha = hashlib.file_digest(f, "sha256").hexdigest()
        return FileDigest(size=os.fstat(f.fileno()).st_size, sha256=sha)


def _digests(root: Path, names: list[str]) -> dict[str, FileDigest]:
    if not names:
        return {}
    with ThreadPoolExecutor(max_workers=min(_THREADS, len(names))) as pool:
        return dict(zip(names, pool.map(lambda name: _digest(root / name), names)))


def _listed_files(root: Path) -> list[str]:
    """Every regular file under `root` (relative, `/`-separated, sorted), checksums.json aside."""
    names = []
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            if path.is_file() and not path.is_symlink():
                names.append(path.relative_to(root).as_posix())
    return sorted(n for n in names if n != CHECKSUMS)


def write_checksums(root: Path) -> None:
    """Collective: hash every file of the step folder `root`; the main rank writes checksums.json."""
    names: list[str] = broadcast_value(_listed_files(root) if is_main() else [])
    parts = gather_values(_digests(root, names[rank() :: world_size()]))

    def write() -> None:
        merged: dict[str, FileDigest] = {}
        for part in parts or []:
            merged.update(part)
        save_checksums(root / CHECKSUMS, Checksums(files=dict(sorted(merged.items()))))

    run_on_main(write, f"writing {root / CHECKSUMS}")


def update_checksums(root: Path, *, written: Iterable[Path] = (), removed_folder: Path | None = None) -> None:
    """One process: record the digests of `written` files and drop the entries under
    `removed_folder` in the step folder `root`'s checksums.json (no-op when it has none)."""
    sums = _load(root)
    if sums is None:
        return
    files = dict(sums.files)
    if removed_folder is not None:
        prefix = Path(removed_folder).relative_to(root).as_posix() + "/"
        files = {name: d for name, d in files.items() if not name.startswith(prefix)}
    for path in written:
        files[Path(path).relative_to(root).as_posix()] = _digest(Path(path))
    save_checksums(root / CHECKSUMS, Checksums(files=dict(sorted(files.items()))))


def _entry_path(root: Path, name: str) -> Path | None:
    """`root / name` for a plain relative name; None for one that would leave the folder."""
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts:
        return None
    return root.joinpath(*pure.parts)


def _compare(root: Path, expected: dict[str, FileDigest], names: Iterable[str]) -> list[str]:
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
    for name, got in _digests(root, todo).items():
        if got.sha256 != expected[name].sha256:
            problems.append(
                f"{root / name}: its bytes differ from the save (SHA-256 does not match {CHECKSUMS}); the file is "
                "damaged: resume from another checkpoint"
            )
    return problems


def _load(root: Path) -> Checksums | None:
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
        sums = _load(root)
    except CheckpointError as exc:
        return exc.problems if len(exc.problems) > 1 else [str(exc)]
    if sums is None:
        return []
    skipped = {Path(p) for p in skip}
    names = [n for n in sorted(sums.files) if (_entry_path(root, n) or root) not in skipped]
    return _compare(root, sums.files, names)


def check_checksums(root: Path) -> None:
    """Collective: raise CheckpointError on every rank when a file of `root` differs from
    checksums.json; the hashing is shared over the ranks."""
    failure = ""
    sums: Checksums | None = None
    try:
        sums = _load(root)
    except CheckpointError as exc:
        failure = str(exc)
    names = sorted(sums.files) if sums is not None else []
    mine = _compare(root, sums.files, names[rank() :: world_size()]) if sums is not None else []
    everyone = gather_values((failure, mine))
    problems: list[str] = broadcast_value(
        sorted({f for f, _ in everyone if f}) + sorted(p for _, part in everyone for p in part) if everyone else []
    )
    if problems:
        raise CheckpointError("\n".join(problems) if len(problems) > 1 else problems[0], problems=problems)
