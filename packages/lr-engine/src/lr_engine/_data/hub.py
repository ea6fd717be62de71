"""Downloading a LeRobot v3 dataset from the Hugging Face Hub into the Hub's own cache.

The contract (the engine calls these; all three read the environment at call time):

- `resolve_revision(repo_id, revision, endpoint=None) -> str`: the commit sha to use.
  `revision` (`--dataset.revision`) may be a branch, a tag or a commit. Without one, lr picks
  the ref LeRobot would: the `v3.0` codebase tag, else the newest `v3.x` ref no newer than it,
  else `main` (where LeRobot would refuse: see `default_revision`). The answer is also written
  to the cache's `refs/`, so with HF_HUB_OFFLINE=1 (or the Hub unreachable) a revision
  resolved once before still resolves.
- `fetch_dataset(repo_id, commit, episodes, endpoint=None, log=print) -> Path`: makes sure
  `meta/` and then only the data and video files that hold the selected episodes (all of them
  for `episodes=None`) are in the cache, and returns the snapshot folder
  (`<cache>/datasets--<org>--<name>/snapshots/<commit>`), laid out as the repo.
- `cached_dataset(repo_id, commit) -> Path | None`: that folder if its meta is already
  cached, without any network (for the ranks that wait while one rank downloads).

Files go into huggingface_hub's cache, laid out as `hf_hub_download` lays it out, so that
huggingface_hub, LeRobot and `try_to_load_from_cache` find them: `snapshot_download` fetches
`meta/` (and the repo's tree listing); each data or video file is fetched by lr with
huggingface_hub's own parts (`get_hf_file_metadata` for its URL, ETag and size,
`build_hf_headers` for the token, `http_get` for the bytes) into `blobs/<etag>`, with
`snapshots/<commit>/<path>` a relative link to it (the file itself where the cache has no
symlinks). HF_HOME / HF_HUB_CACHE, HF_ENDPOINT (or `endpoint=`), HF_TOKEN (or `hf auth login`)
and HF_HUB_OFFLINE=1 behave as in any Hub tool. Data and video files travel over HTTP(S) with
`Range` requests, the route huggingface_hub takes without hf_xet, even where hf_xet is
installed: a Xet transfer cannot resume a file in a later run. lr never writes, prints or puts
in a message the token.

What is on disk is checked, never trusted blindly. A file must have the size the Hub's tree
listing gives, and its content must hash to its blob's name in the cache, which is the ETag
the Hub served it under (sha256 for LFS files, the git blob sha1 otherwise; the latter must
also be the listing's `oid`). The hash is computed once, right after the download (or the
first time lr sees a blob something else downloaded); a marker beside the blobs
(`<repo folder>/.lr-verified/<blob>`, holding the blob's size, mtime and inode) lets later
runs trust it after a `stat`, and a rewrite of the blob (a new mtime or inode) voids the
marker. A download is checked before it becomes a blob, so a bad one never lands in the cache;
a cached file that fails is deleted (pointer, blob, marker). Either is fetched again; if the
fresh copy fails too, a `DatasetError` names it. Caches without symlinks (Windows without
developer mode, HF_HUB_DISABLE_SYMLINKS=1) keep no blobs named by their hash: there a download
is still hashed before it lands, but a cached file is checked by its size only.

Interrupted downloads: a data or video file downloads into a partial file whose name is the
same in every run and process, `<repo folder>/blobs/<etag>.lr-partial`, under huggingface_hub's
lock for that blob (`<cache>/.locks/<repo folder>/<etag>.lock`, the one `hf_hub_download`
takes): a second process or thread that needs the same blob waits, then uses the blob, rather
than write to the same partial file. When a connection drops midway, `http_get` asks for the
rest with a `Range` request, up to 5 times in a row without a new byte; when those fail too, or
the process dies, the partial file stays, and the next run that needs the file asks for
`Range: bytes=<its size>-`, appends to it and says so in `log`. A server that answers such a
request with the whole file (HTTP 200) is read from the first byte, and a partial file longer
than the file is started over. A partial file becomes the blob only once it has the size the
Hub serves and hashes to its ETag; one that does not (its bytes damaged on disk, say) is deleted
and the file fetched again from the first byte, once, as any bad download is. Files completed
before an interruption stay in the cache and are not fetched again. The meta files, fetched by
`snapshot_download`, are small and start over.

Progress: huggingface_hub's progress bars when stderr is a terminal; otherwise the bars are
off and `log` gets one line per file downloaded (path and size).

Every failure is a `DatasetError` whose message names the repo and says what to change: an
unknown (or private) repo, no access, a gated repo, an unknown `--dataset.revision`, an
unreachable Hub (with the endpoint and HF_ENDPOINT), offline with nothing cached, a cache that
cannot be written, a file that stays corrupt.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import pyarrow.parquet as pq
from huggingface_hub import (
    HfApi,
    constants,
    file_download,
    get_cached_repo_tree,
    get_hf_file_metadata,
    hf_hub_url,
    snapshot_download,
)
from huggingface_hub.errors import (
    CachedRepoTreeNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
    RevisionResolutionError,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import WeakFileLock, build_hf_headers  # type: ignore[attr-defined]
from huggingface_hub.utils.tqdm import tqdm as hf_tqdm
from lr_config import read_json_object
from lr_config.datasets import hub_cache_dir, hub_dataset_folder

from .errors import DatasetError

__all__ = [
    "CODEBASE_VERSION",
    "cached_dataset",
    "codebase_ref",
    "default_revision",
    "episode_files",
    "fetch_dataset",
    "hub_cache_dir",
    "resolve_revision",
]

CODEBASE_VERSION = "v3.0"
REPO_TYPE = "dataset"
MAX_WORKERS = 8  # huggingface_hub's own default for parallel file downloads
_META_PATTERNS = ["meta/*"]  # fnmatch: `*` also matches `/`, so every file below meta/
_VERSION_RE = re.compile(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?")
_EPISODE_COLUMNS = ("episode_index", "data/chunk_index", "data/file_index")
_MARKERS = ".lr-verified"
_PARTIAL = ".lr-partial"  # <repo folder>/blobs/<etag>.lr-partial: a download under way, or interrupted
_HASH_NAME = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # a git blob sha1 or an LFS sha256
_HASH_CHUNK = 8 * 1024 * 1024

Log = Callable[[str], Any]


# -- where and how: the environment, read at call time ---------------------------------------
# huggingface_hub reads HF_ENDPOINT, HF_HUB_CACHE and HF_HUB_OFFLINE once, at import; a
# launcher (or a test) may set them later, so lr reads them per call and passes them on.


@dataclass(frozen=True)
class _Hub:
    endpoint: str
    cache_dir: Path
    offline: bool


def _truthy(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _hub(endpoint: str | None) -> _Hub:
    chosen = endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    offline = _truthy(os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")) or constants.is_offline_mode()
    return _Hub(chosen.rstrip("/"), hub_cache_dir(), offline)


def _api(hub: _Hub) -> HfApi:
    return HfApi(endpoint=hub.endpoint)  # token: HF_TOKEN or the login, read by huggingface_hub per request


def _repo_folder(hub: _Hub, repo_id: str) -> Path:
    return hub_dataset_folder(repo_id, hub.cache_dir)


def _snapshot(hub: _Hub, repo_id: str, commit: str) -> Path:
    return _repo_folder(hub, repo_id) / "snapshots" / commit


# -- revisions ---------------------------------------------------------------------------------


def _version(name: str) -> tuple[int, int, int] | None:
    match = _VERSION_RE.fullmatch(name)
    return None if match is None else (int(match.group(1)), int(match.group(2) or 0), int(match.group(3) or 0))


def codebase_ref(names: Iterable[str]) -> str | None:
    """The ref LeRobot's `get_safe_version` picks for CODEBASE_VERSION among `names` (branches
    and tags): the exact version, else the newest of the same major version and no newer minor."""
    target = _version(CODEBASE_VERSION)
    assert target is not None
    versions = {name: v for name in names if (v := _version(name)) is not None}
    exact = [name for name, v in versions.items() if v == target]
    if exact:
        return CODEBASE_VERSION if CODEBASE_VERSION in exact else exact[0]
    compatible = [name for name, v in versions.items() if v[0] == target[0] and v[1] <= target[1]]
    return max(compatible, key=lambda name: versions[name]) if compatible else None


def _cached_ref_names(hub: _Hub, repo_id: str) -> list[str]:
    refs = _repo_folder(hub, repo_id) / "refs"
    return [p.relative_to(refs).as_posix() for p in refs.rglob("*") if p.is_file()] if refs.is_dir() else []


def default_revision(repo_id: str, *, endpoint: str | None = None) -> str:
    """The ref a run without `--dataset.revision` uses.

    LeRobot (`LeRobotDataset(repo_id)`) asks for its codebase version, `v3.0`: it lists the
    repo's branches and tags, takes `v3.0` if present, else the newest `v3.x` below it, and
    refuses a repo with no version ref (or only older or newer major versions). lr takes the
    same ref when there is one and `main` otherwise, and then refuses a `meta/info.json` whose
    codebase_version is not v3. Offline (or with the Hub unreachable) the refs cached by an
    earlier run decide the same way.
    """
    hub = _hub(endpoint)
    if not hub.offline:
        try:
            refs = _api(hub).list_repo_refs(repo_id, repo_type=REPO_TYPE)
            return codebase_ref([r.name for r in [*refs.branches, *refs.tags]]) or "main"
        except Exception as exc:  # noqa: BLE001 - classified below; only an unreachable Hub falls back
            if not _unreachable(exc):
                raise _dataset_error(exc, repo_id, hub, None) from None
    return codebase_ref(_cached_ref_names(hub, repo_id)) or "main"


def resolve_revision(repo_id: str, revision: str | None, *, endpoint: str | None = None) -> str:
    """The commit sha of `revision` (a branch, tag or commit; None: `default_revision`).

    Online, the Hub answers and the mapping is cached in `refs/`; offline (HF_HUB_OFFLINE=1) or
    with the Hub unreachable, the cached mapping answers. A DatasetError otherwise.
    """
    hub = _hub(endpoint)
    name = revision if revision is not None else default_revision(repo_id, endpoint=endpoint)
    try:
        resolved = _api(hub).resolve_revision(
            repo_id, repo_type=REPO_TYPE, revision=name, cache_dir=hub.cache_dir, local_files_only=hub.offline
        )
    except Exception as exc:  # noqa: BLE001 - every failure becomes one DatasetError
        raise _dataset_error(exc, repo_id, hub, revision, ref=name) from None
    return str(resolved.resolved)


# -- the cached files and their checks ---------------------------------------------------------


@dataclass(frozen=True)
class _Listed:
    """What the Hub's tree listing says about a file."""

    size: int
    oid: str  # the git blob sha1 (of the LFS pointer, for an LFS file)


def _listing(hub: _Hub, repo_id: str, commit: str) -> dict[str, _Listed] | None:
    """The tree listing huggingface_hub cached for the commit (None: not cached)."""
    try:
        files = get_cached_repo_tree(repo_id, repo_type=REPO_TYPE, revision=commit, cache_dir=hub.cache_dir)
    except CachedRepoTreeNotFoundError:
        return None
    return {f.path: _Listed(int(f.size), str(f.blob_id)) for f in files}


def _blob_of(pointer: Path) -> Path | None:
    """The content-addressed blob (`<repo folder>/blobs/<etag>`) a snapshot file links to; None
    when the cache keeps no links. One hop only: a blob may itself link into a shared store
    whose names are not the ETag."""
    if not pointer.is_symlink():
        return None
    blob = Path(os.path.normpath(pointer.parent / os.readlink(pointer)))
    named_by_hash = _HASH_NAME.fullmatch(blob.name) is not None
    return blob if named_by_hash and blob.parent.name == "blobs" else None


def _content_hash(path: Path, *, lfs: bool) -> str:
    """The file's hash as the Hub's ETag gives it: sha256 of the bytes for an LFS file, else
    the git blob sha1."""
    size = path.stat().st_size
    digest = hashlib.sha256() if lfs else hashlib.sha1(b"blob %d\0" % size)
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _stamp(blob: Path) -> str:
    st = blob.stat()
    return f"{st.st_size} {st.st_mtime_ns} {st.st_ino}\n"


def _marker(blob: Path) -> Path:
    return blob.parent.parent / _MARKERS / blob.name  # <repo folder>/.lr-verified/<blob name>


def _verified_before(blob: Path) -> bool:
    try:
        return _marker(blob).read_text() == _stamp(blob)
    except OSError:
        return False


def _mark_verified(blob: Path) -> None:
    marker = _marker(blob)
    marker.parent.mkdir(parents=True, exist_ok=True)
    tmp = marker.with_name(f".{marker.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # two paths may share a blob
    tmp.write_text(_stamp(blob))
    os.replace(tmp, marker)  # atomic: a reader sees no marker or a whole one


def _problem(pointer: Path, listed: _Listed | None) -> str | None:
    """Why the cached file must not be used, or None when it is good (hashing it at most once)."""
    if not pointer.exists():
        return "is missing"
    size = pointer.stat().st_size
    if listed is not None and size != listed.size:
        return f"has {size} bytes where the Hub lists {listed.size}"
    blob = _blob_of(pointer)
    if blob is None:
        return None
    if listed is not None and len(blob.name) == 40 and blob.name != listed.oid:
        return f"is blob {blob.name} where the Hub lists {listed.oid}"
    if _verified_before(blob):
        return None
    if _content_hash(blob, lfs=len(blob.name) == 64) != blob.name:
        return f"does not hash to {blob.name}, the hash the Hub served it under"
    _mark_verified(blob)
    return None


def _evict(pointer: Path) -> None:
    """Delete a bad file from the cache: its snapshot entry, its blob and its marker."""
    blob = _blob_of(pointer)
    for path in ([blob, _marker(blob)] if blob is not None else []) + [pointer]:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


# -- downloading -------------------------------------------------------------------------------


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


def _same_site(url: str, target: str, endpoint: str) -> bool:
    """Whether `target` (where the Hub sent a download) is the Hub itself, which gets the token
    (as huggingface_hub decides: the same origin, or a Hub origin), rather than a signed CDN URL."""
    hubs = (endpoint, constants.ENDPOINT, "https://huggingface.co", "https://hf.co", "https://hub-ci.huggingface.co")
    return _origin(target) in {_origin(url), *(_origin(h) for h in hubs)}


def _place(blob: Path, pointer: Path, folder: Path, *, new_blob: bool) -> bool:
    """The snapshot entry for a blob, as huggingface_hub makes it: a relative symlink, or where
    the cache has none the file itself (moved when the blob is new, else copied). True: a link."""
    if os.path.lexists(pointer):
        pointer.unlink()
    if file_download.are_symlinks_supported(folder):
        try:
            os.symlink(os.path.relpath(blob, pointer.parent), pointer)
            return True
        except FileExistsError:  # made meanwhile by a process that did not take the lock
            if os.path.realpath(pointer) == os.path.realpath(blob):
                return True
            raise
        except PermissionError:  # as huggingface_hub: fall back to a real file
            pass
    if new_blob:
        shutil.move(blob, pointer)
    else:
        shutil.copyfile(blob, pointer)
    return False


class _NoBars(hf_tqdm):
    """huggingface_hub's bar class, always off (logs get one line per file instead)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]


def _bars_wanted() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _size_text(n: int) -> str:
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"


@dataclass
class _Fetch:
    """One fetch_dataset call: the repo at a commit, where it goes, how it reports."""

    repo_id: str
    commit: str
    hub: _Hub
    log: Log
    bars: bool

    @property
    def snapshot(self) -> Path:
        return _snapshot(self.hub, self.repo_id, self.commit)

    @property
    def tqdm_class(self) -> type[hf_tqdm] | None:
        return None if self.bars else _NoBars  # None: huggingface_hub's own bars

    def error(self, exc: BaseException) -> DatasetError:
        return _dataset_error(exc, self.repo_id, self.hub, self.commit)

    def fetch_meta(self) -> dict[str, _Listed] | None:
        """meta/ in the cache and checked; returns the tree listing (None: not cached, offline).

        snapshot_download fetches the listing once per commit (huggingface_hub caches it in
        `trees/<commit>.json`, which also makes later and offline calls need no request) and
        the meta files; then each meta file is checked like any other file."""
        before = set(self._present("meta/"))
        try:
            snapshot_download(
                self.repo_id, repo_type=REPO_TYPE, revision=self.commit, cache_dir=self.hub.cache_dir,
                endpoint=self.hub.endpoint, allow_patterns=_META_PATTERNS, local_files_only=self.hub.offline,
                tqdm_class=self.tqdm_class, max_workers=MAX_WORKERS,
            )
        except Exception as exc:  # noqa: BLE001 - every failure becomes one DatasetError
            raise self.error(exc) from None
        listing = _listing(self.hub, self.repo_id, self.commit)
        meta = sorted(p for p in listing if p.startswith("meta/")) if listing is not None else self._present("meta/")
        for path in meta:
            if path not in before:
                self._report(path)
        self.ensure(meta, listing)
        if not (self.snapshot / "meta" / "info.json").is_file():
            raise DatasetError(f"dataset {self.repo_id!r} at {self.commit} has no meta/info.json: it is not a LeRobot "
                               "v3 dataset (check --dataset.repo_id and --dataset.revision)")
        return listing

    def _present(self, prefix: str) -> list[str]:
        folder = self.snapshot / prefix
        if not folder.is_dir():
            return []
        return sorted(p.relative_to(self.snapshot).as_posix() for p in folder.rglob("*") if os.path.lexists(p) and not p.is_dir())

    def require_listed(self, paths: list[str], listing: dict[str, _Listed] | None) -> None:
        """Refuse, before any download, files the meta names but the repo lacks."""
        absent = [p for p in paths if listing is not None and p not in listing]
        if absent:
            raise DatasetError(
                f"dataset {self.repo_id!r} at {self.commit}: meta/episodes refers to {len(absent)} file(s) the repo "
                f"does not have (first: {absent[0]}); the dataset is incomplete on the Hub: pick another "
                "--dataset.revision or --dataset.episodes"
            )

    def ensure(self, paths: list[str], listing: dict[str, _Listed] | None) -> None:
        """Every path cached and good: bad ones evicted, missing ones downloaded and checked."""
        missing = [p for p in paths if not self._usable(p, listing)]
        if not missing:
            return
        if self.hub.offline:
            raise _offline_error(self.hub, f"{len(missing)} file(s) of dataset {self.repo_id!r} at {self.commit} "
                                           f"that the run needs (first: {missing[0]}) are not")
        total = sum(listing[p].size for p in missing) if listing is not None else None
        amount = f" ({_size_text(total)})" if total is not None else ""
        self.log(f"downloading {len(missing)} file(s){amount} of dataset {self.repo_id} at {self.commit[:8]} "
                 f"from {self.hub.endpoint} into {self.hub.cache_dir}")
        pool = ThreadPoolExecutor(max_workers=min(MAX_WORKERS, len(missing)))
        try:
            futures = {pool.submit(self._download_checked, p, listing): p for p in missing}
            for future in as_completed(futures):
                future.result()
                self._report(futures[future])
        finally:  # on a failure, start no further download (the ones under way finish)
            pool.shutdown(wait=True, cancel_futures=True)

    def _usable(self, path: str, listing: dict[str, _Listed] | None) -> bool:
        pointer = self.snapshot / path
        if not os.path.lexists(pointer):
            return False
        problem = _problem(pointer, None if listing is None else listing.get(path))
        if problem is None:
            return True
        self.log(f"{self.repo_id}: cached {path} {problem}; deleting it and fetching it again")
        _evict(pointer)
        return False

    def _download_checked(self, path: str, listing: dict[str, _Listed] | None) -> None:
        """Download one file and check it; a bad copy is deleted and fetched once more."""
        listed = None if listing is None else listing.get(path)
        problem = None
        for attempt in range(2):
            try:
                problem = self._download(path, listed)
            except DatasetError:
                raise
            except Exception as exc:  # noqa: BLE001 - every failure becomes one DatasetError
                raise self.error(exc) from None
            if problem is None:
                pointer = self.snapshot / path
                problem = _problem(pointer, listed)  # the listing's size and oid; no hashing again
                if problem is None:
                    return
                _evict(pointer)
            if attempt == 0:
                self.log(f"{self.repo_id}: downloaded {path} {problem}; deleted it, fetching it again")
        raise DatasetError(
            f"dataset {self.repo_id!r} at {self.commit}: {path} {problem}, in two downloads from {self.hub.endpoint}; "
            "nothing was kept. Retry later (a proxy or the network may alter downloads), or pass --dataset.root="
            "<a verified local copy>"
        )

    def _download(self, path: str, listed: _Listed | None) -> str | None:
        """One file into the cache as `hf_hub_download` would put it, through a partial file that
        a later run resumes (see the module docstring); returns why the download is bad, or None."""
        url = hf_hub_url(self.repo_id, path, repo_type=REPO_TYPE, revision=self.commit, endpoint=self.hub.endpoint)
        headers = build_hf_headers()  # the token: HF_TOKEN or the login, as huggingface_hub reads it
        meta = get_hf_file_metadata(url, headers=headers, timeout=constants.HF_HUB_ETAG_TIMEOUT,
                                    endpoint=self.hub.endpoint, retry_on_errors=True)
        if meta.etag is None or meta.commit_hash is None:
            raise DatasetError(
                f"the server at {self.hub.endpoint} (HF_ENDPOINT) answered for {path} of dataset {self.repo_id!r} "
                "without an ETag or X-Repo-Commit header: it does not serve as a Hugging Face Hub does; check "
                "HF_ENDPOINT (and any proxy), or pass --dataset.root=<a local copy>"
            )
        source = meta.location or url
        if not _same_site(url, source, self.hub.endpoint):
            headers.pop("authorization", None)  # a signed CDN address: the token stays with the Hub
        size = meta.size if meta.size is not None else (listed.size if listed is not None else None)
        folder = _repo_folder(self.hub, self.repo_id)
        blob, pointer = folder / "blobs" / meta.etag, self.snapshot / path
        lock = self.hub.cache_dir / ".locks" / folder.name / f"{meta.etag}.lock"  # hf_hub_download's, too
        for parent in (blob.parent, pointer.parent, lock.parent):
            parent.mkdir(parents=True, exist_ok=True)
        with WeakFileLock(lock):
            new_blob = not blob.exists()  # else another process (or a thread) has just fetched it
            if new_blob:
                problem = self._fill(blob, source, headers, size, path)
                if problem is not None:
                    return problem
            linked = _place(blob, pointer, folder, new_blob=new_blob)
            if linked and new_blob and _HASH_NAME.fullmatch(blob.name):
                _mark_verified(blob)  # _fill has hashed it
        return None

    def _fill(self, blob: Path, url: str, headers: dict[str, str], size: int | None, path: str) -> str | None:
        """Download into `<blob>.lr-partial` from the bytes already there, check the size and the
        hash, and make it the blob; returns why it is bad (the partial file deleted), or None."""
        partial = blob.with_name(blob.name + _PARTIAL)
        headers = {**headers, "Accept-Encoding": "identity"}  # ranges count the file's own bytes
        with partial.open("ab") as f:
            have = f.seek(0, os.SEEK_END)
            if have and (size is None or have > size):  # nothing to resume against, or not a prefix
                f.truncate(0)
                have = 0
            if have:
                self.log(f"{self.repo_id}: resuming {path} after the {_size_text(have)} an earlier download left")
            http_get(url, f, resume_size=have, headers=headers, expected_size=size, displayed_filename=path,
                     tqdm_class=self.tqdm_class)
        got = partial.stat().st_size
        problem = None
        if size is not None and got != size:
            problem = f"has {got} bytes where the Hub serves {size}"
        elif _HASH_NAME.fullmatch(blob.name) and _content_hash(partial, lfs=len(blob.name) == 64) != blob.name:
            problem = f"does not hash to {blob.name}, the hash the Hub served it under"
        if problem is not None:
            partial.unlink(missing_ok=True)
            return problem
        os.replace(partial, blob)
        return None

    def _report(self, path: str) -> None:
        if self.bars:
            return
        pointer = self.snapshot / path
        size = pointer.stat().st_size if pointer.exists() else 0
        self.log(f"downloaded {self.repo_id}/{path} ({_size_text(size)})")


# -- which files the episodes need -------------------------------------------------------------


def _episode_rows(snapshot: Path) -> list[dict[str, Any]]:
    files = sorted((snapshot / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    if not files:
        raise DatasetError(f"{snapshot / 'meta' / 'episodes'}: no episode parquet files; not a LeRobot v3 dataset")
    rows: list[dict[str, Any]] = []
    for f in files:
        try:
            names = pq.read_schema(f).names
            wanted = [c for c in names if c == "episode_index" or c.endswith(("/chunk_index", "/file_index"))]
            table = pq.read_table(f, columns=wanted)
        except (OSError, ValueError) as exc:  # pyarrow's errors are ValueError or OSError subclasses
            raise DatasetError(f"{f}: cannot read the episodes table ({type(exc).__name__})") from None
        lacking = [c for c in _EPISODE_COLUMNS if c not in names]
        if lacking:
            raise DatasetError(f"{f}: no column(s) {lacking}; not a LeRobot v3 episodes table")
        rows.extend(table.to_pylist())
    return rows


def _video_keys(info: dict[str, Any]) -> list[str]:
    return [key for key, feat in dict(info.get("features", {})).items() if isinstance(feat, dict) and feat.get("dtype") == "video"]


def episode_files(snapshot: Path, info: dict[str, Any], episodes: list[int] | None) -> list[str]:
    """The data and video files (repo paths) that hold the episodes (all for None), from
    `meta/info.json`'s `data_path`/`video_path` and the `meta/episodes/` tables."""
    rows = _episode_rows(snapshot)
    by_index = {int(row["episode_index"]): row for row in rows}
    if episodes is not None:
        unknown = sorted(set(episodes) - set(by_index))
        if unknown:
            raise DatasetError(f"--dataset.episodes: episodes {unknown} are not in the dataset (it has {len(by_index)})")
    selected = [by_index[e] for e in (sorted(set(episodes)) if episodes is not None else sorted(by_index))]
    paths: dict[str, None] = {}
    for row in selected:
        paths[_template(info, "data_path", snapshot).format(
            chunk_index=int(row["data/chunk_index"]), file_index=int(row["data/file_index"]))] = None
    for key in _video_keys(info):
        template = _template(info, "video_path", snapshot)
        for row in selected:
            chunk, file = row.get(f"videos/{key}/chunk_index"), row.get(f"videos/{key}/file_index")
            if chunk is None or file is None:
                raise DatasetError(f"{snapshot / 'meta' / 'episodes'}: no videos/{key}/chunk_index or file_index for "
                                   f"episode {row['episode_index']}; the dataset's meta is incomplete")
            paths[template.format(video_key=key, chunk_index=int(chunk), file_index=int(file))] = None
    return list(paths)


def _template(info: dict[str, Any], key: str, snapshot: Path) -> str:
    value = info.get(key)
    if not isinstance(value, str) or not value:
        raise DatasetError(f"{snapshot / 'meta' / 'info.json'}: missing {key!r}; not a LeRobot v3 dataset")
    return value


def _read_info(snapshot: Path, repo_id: str, commit: str) -> dict[str, Any]:
    path = snapshot / "meta" / "info.json"
    info = read_json_object(path, error=DatasetError, damaged=f" in dataset {repo_id!r} at {commit}")
    version = str(info.get("codebase_version", ""))
    if not version.startswith("v3"):
        raise DatasetError(
            f"dataset {repo_id!r} at {commit} is codebase_version {version!r}; lr reads LeRobot v3 datasets: pass "
            f"--dataset.revision=<a v3 branch, tag or commit>, or convert it with LeRobot's v2.1 to v3.0 converter"
        )
    return info


# -- the API -----------------------------------------------------------------------------------


def fetch_dataset(repo_id: str, commit: str, episodes: list[int] | None, *, endpoint: str | None = None,
                  log: Log = print) -> Path:
    """meta/, then the data and video files of `episodes` (None: all), in the Hub's cache at
    `commit` (see `resolve_revision`); returns the snapshot folder. Nothing cached and good is
    downloaded again; see the module docstring for the checks and the errors."""
    fetch = _Fetch(repo_id, commit, _hub(endpoint), log, _bars_wanted())
    listing = fetch.fetch_meta()
    info = _read_info(fetch.snapshot, repo_id, commit)
    needed = episode_files(fetch.snapshot, info, episodes)
    fetch.require_listed(needed, listing)
    fetch.ensure(needed, listing)
    return fetch.snapshot


def fetch_meta(repo_id: str, commit: str, *, endpoint: str | None = None, log: Log = print) -> Path:
    """Only `meta/` of the dataset at `commit` (what a dry run reads); returns the snapshot folder."""
    fetch = _Fetch(repo_id, commit, _hub(endpoint), log, _bars_wanted())
    fetch.fetch_meta()
    _read_info(fetch.snapshot, repo_id, commit)
    return fetch.snapshot


def cached_dataset(repo_id: str, commit: str) -> Path | None:
    """The snapshot folder of repo_id at commit if its meta is in the cache (no network)."""
    snapshot = _snapshot(_hub(None), repo_id, commit)
    return snapshot if (snapshot / "meta" / "info.json").is_file() else None


# -- errors ------------------------------------------------------------------------------------


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _find(exc: BaseException, kind: type[BaseException] | tuple[type[BaseException], ...]) -> Any:
    return next((e for e in _chain(exc) if isinstance(e, kind)), None)


def _status(exc: BaseException) -> int | None:
    http = _find(exc, HfHubHTTPError)
    response = getattr(http, "response", None)
    return None if response is None else int(response.status_code)


def _unreachable(exc: BaseException) -> bool:
    """No usable answer from the Hub (connection, timeout, 5xx, a non-Hub answer), as opposed
    to an answer that says no."""
    if _find(exc, OfflineModeIsEnabled) is not None:
        return False
    if _find(exc, (httpx2.TransportError, TimeoutError, LocalEntryNotFoundError, RevisionResolutionError)) is not None:
        return True
    status = _status(exc)
    return status is not None and (status >= 500 or status in (408, 429))


def _offline_error(hub: _Hub, what: str) -> DatasetError:
    """`what` names the repo and ends with its verb: "dataset 'a/b' at <sha> is not"."""
    return DatasetError(
        f"HF_HUB_OFFLINE=1 and {what} in the Hugging Face cache ({hub.cache_dir}): unset HF_HUB_OFFLINE to download "
        "(a run online fills the cache), or pass --dataset.root=<a local copy>"
    )


def _dataset_error(exc: BaseException, repo_id: str, hub: _Hub, revision: str | None, *, ref: str | None = None) -> DatasetError:
    """One message per failure kind; never the token, never a traceback (see the module docstring)."""
    page = f"{hub.endpoint}/datasets/{repo_id}"
    gated = _find(exc, GatedRepoError)
    if _find(exc, HFValidationError) is not None:
        return DatasetError(f"--dataset.repo_id: {repo_id!r} is not a Hub repo id; use <user or org>/<name>, or pass "
                            "--dataset.root=<a local copy>")
    if hub.offline or _find(exc, OfflineModeIsEnabled) is not None:
        if ref is not None:  # resolving a revision by name: its ref was never cached
            return _offline_error(hub, f"revision {ref!r} of dataset {repo_id!r} is not resolved")
        return _offline_error(hub, f"dataset {repo_id!r} at {revision} is not")
    if gated is not None:
        if _status(gated) == 403:
            return DatasetError(f"dataset {repo_id!r} is gated and the account of your token has not been granted access: "
                                f"accept its terms on {page} with that account (or wait for approval), then run again")
        return DatasetError(f"dataset {repo_id!r} is gated: accept its terms on {page}, then set HF_TOKEN to a token of "
                            "that account (or run `hf auth login`) and run again")
    if _find(exc, RevisionNotFoundError) is not None:
        asked = revision if revision is not None else ref
        flag = "--dataset.revision" if revision is not None else f"the default revision ({ref or CODEBASE_VERSION})"
        return DatasetError(f"{flag}: {asked!r} is not a branch, tag or commit of dataset {repo_id!r} on {hub.endpoint}; "
                            f"see {page}/tree/main for its branches and tags, and pass --dataset.revision=<one of them>")
    if _find(exc, RemoteEntryNotFoundError) is not None:
        return DatasetError(f"dataset {repo_id!r} at {revision}: a file its meta lists is not in the repo; the dataset is "
                            "incomplete on the Hub: pick another --dataset.revision or --dataset.episodes")
    if _find(exc, RepositoryNotFoundError) is not None:
        return DatasetError(f"--dataset.repo_id: dataset {repo_id!r} does not exist on {hub.endpoint}, or it is private "
                            "and your token cannot see it: check the name, or set HF_TOKEN (or run `hf auth login`) "
                            "with an account that has access")
    status = _status(exc)
    if status == 401:
        return DatasetError(f"the Hub at {hub.endpoint} rejected your token (HTTP 401) for dataset {repo_id!r}: set HF_TOKEN "
                            "to a valid token (or run `hf auth login`), or unset it for a public dataset")
    if status == 403:
        return DatasetError(f"the Hub at {hub.endpoint} refused access to dataset {repo_id!r} (HTTP 403): use a token with "
                            "read access to it (HF_TOKEN or `hf auth login`)")
    if _unreachable(exc):
        answer = f"answered HTTP {status}" if status is not None else "could not be reached"
        return DatasetError(f"the Hugging Face Hub at {hub.endpoint} (HF_ENDPOINT) {answer} while downloading dataset "
                            f"{repo_id!r}, and what the run needs is not in the cache ({hub.cache_dir}): check the network "
                            "or HF_ENDPOINT and run again, or pass --dataset.root=<a local copy>")
    if status is not None:
        return DatasetError(f"the Hub at {hub.endpoint} answered HTTP {status} for dataset {repo_id!r}: run again later, or "
                            "pass --dataset.root=<a local copy>")
    disk = next((e for e in _chain(exc) if isinstance(e, OSError) and e.errno is not None), None)
    if disk is not None:
        return DatasetError(f"cannot write dataset {repo_id!r} into the Hugging Face cache {hub.cache_dir} "
                            f"({disk.strerror or type(disk).__name__}): free space there, or set HF_HOME or HF_HUB_CACHE "
                            "to another folder")
    return DatasetError(f"downloading dataset {repo_id!r} from {hub.endpoint} failed ({type(exc).__name__}); run again, "
                        "or pass --dataset.root=<a local copy>")
