"""Shared fixtures: a loopback Hugging Face Hub for the real `huggingface_hub` client.

`LoopbackHub` is a stdlib `ThreadingHTTPServer` on 127.0.0.1 (random port) that answers
the calls `HfApi(endpoint=hub.endpoint)` makes to create a repo and push a folder, and the
calls `hf_hub_download` / `snapshot_download` / LeRobot make to download a dataset:

| request                                          | answer                                    |
|--------------------------------------------------|-------------------------------------------|
| `POST /api/repos/create`                         | creates `ns/name` (409 when it exists)    |
| `GET  /api/{type}s/{id}[/revision/{rev}]`        | repo info: sha, private, gated, siblings  |
| `GET  /api/{type}s/{id}/refs`                    | branches and tags                         |
| `GET  /api/{type}s/{id}/tree/{rev}[/{path}]`     | entries (all below, with `recursive`):    |
|                                                  | size, oid (git sha1), lfs {oid, size}     |
| `HEAD/GET /[{type}s/]{id}/resolve/{rev}/{path}`  | the file: quoted `ETag` (sha256 for LFS,  |
|                                                  | git sha1 otherwise), `X-Repo-Commit`,     |
|                                                  | `Content-Length`, `X-Linked-Etag`/`-Size` |
|                                                  | for LFS; `Range: bytes=a-[b]` gets a 206  |
| `PUT  /api/{type}s/{id}/settings`                | sets `visibility` (private or public)     |
| `POST /api/{type}s/{id}/branch/{branch}`         | creates a branch from main (409 if there) |
| `POST /api/validate-yaml`                        | 400 when the README front matter is bad   |
| `POST /api/{type}s/{id}/preupload/{rev}`         | `lfs` for weights or >= `lfs_threshold`   |
| `POST /{id}.git/info/lfs/objects/batch`          | basic-transfer upload + verify hrefs here |
| `PUT  /lfs-upload/{oid}`                         | stores the bytes (sha256 checked)         |
| `POST /{id}.git/info/lfs/objects/verify`         | 200 when the object is stored             |
| `POST /api/{type}s/{id}/commit/{rev}`            | NDJSON: `file` (base64), `lfsFile`, deletes |
| `GET  /api/whoami-v2`                            | a fixed user                              |

`{rev}` is a branch, a tag or a commit sha (every commit's tree is kept). Anything else is a
404 and lands in `hub.unhandled`. State (repos, LFS objects) lives in the `LoopbackHub`
object, so `stop()` then `start()` simulates an outage on the same port.

Access, as the real Hub answers it, for repos made with `add_dataset` (repos created through
the API keep answering everyone): a private repo answers 401 `RepoNotFound` without a token
and 404 `RepoNotFound` for a token it was not granted; a gated repo shows its info, refs and
tree to everyone, but its files answer 401 `GatedRepo` without a token and 403 `GatedRepo`
for a token that was not granted (`hub.grant(repo_id, token)` accepts the terms for it).

Xet: huggingface_hub 2.4 sends every LFS-mode file through the Xet protocol when hf_xet is
installed, and Xet's CAS server cannot be imitated here. The `hub_server` fixture therefore
sets `HF_HUB_DISABLE_XET=1` (environment, for subprocesses, and the already-imported
constant, in-process), which makes the same client use the git-LFS batch API instead. The
xet token route answers 501 with that advice.

Test hooks: `hub.files(repo_id)` (bytes per path on a branch), `hub.requests` (method, path,
headers with the Authorization value redacted, body), `hub.fail_next(n, status)` (the next n
matching requests get that status), `hub.outage_on(path_part)` (drop that request and go
down), `hub.require_token(token)` (401 for any other token). Each of `hub.repos[id].commits`
records the paths it `added` and `deleted`. For downloads:

- `hub.add_dataset(repo_id, folder_or_files, tags=("v3.0",), gated=False, private=False,
  branch="main")` puts a folder (or {path: bytes}) in a dataset repo as one new commit on
  `branch` (replacing its tree), tags that commit, and returns its sha; `hub.tag(repo_id,
  tag, revision)` and `hub.grant(repo_id, token)` do one thing each;
- `hub.cut_next(path_part, after=None, times=1)`: the next GET of a file whose path contains
  path_part announces the full length, sends `after` bytes (default: half) and drops the
  connection (the client resumes with `Range`);
- `hub.corrupt_next(path_part, times=1)`: the next GET of such a file sends as many wrong
  bytes, with the right headers (ETag, length);
- `hub.ignore_range_next(path_part, times=1)`: the next GET of such a file that asks for a
  `Range` gets the whole file (200), as a server or proxy that ignores `Range` answers;
- `hub.downloads(repo_id)`: GETs of each file of the repo (a Counter by path in the repo);
  `hub.requests_per_path(method)`: a Counter of every request path.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

__all__ = ["HubRepo", "LoopbackHub", "RecordedRequest", "hub_server"]

_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".npy", ".npz", ".parquet", ".arrow", ".mp4", ".zip", ".tar")
_REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
_SECRET_HEADERS = ("authorization", "cookie", "x-amz-security-token")


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    status: int = 0


@dataclass
class StoredFile:
    data: bytes
    lfs: bool


@dataclass
class HubRepo:
    repo_id: str
    repo_type: str
    private: bool
    trees: dict[str, dict[str, StoredFile]] = field(default_factory=lambda: {"main": {}})
    heads: dict[str, str] = field(default_factory=dict)
    commits: list[dict[str, Any]] = field(default_factory=list)
    snapshots: dict[str, dict[str, StoredFile]] = field(default_factory=dict)  # commit sha -> tree
    tags: dict[str, str] = field(default_factory=dict)  # tag -> commit sha
    gated: bool = False
    granted: set[str] | None = None  # tokens with access; None: no access control (API-made repos)


@dataclass
class _Failure:
    remaining: int
    status: int
    path_part: str | None


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.extra = status, message, code, extra


def _git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


_CUT_AFTER = "X-Loopback-Cut-After"  # internal: the handler sends this many body bytes, then drops


def _files_of(source: Path | Mapping[str, bytes]) -> dict[str, bytes]:
    if isinstance(source, Mapping):
        return {str(path): bytes(data) for path, data in source.items()}
    root = Path(source)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, stop) of a `Range: bytes=a-[b]` header, None for a full answer."""
    match = re.fullmatch(r"bytes=(\d+)-(\d*)", (header or "").strip())
    if match is None:
        return None
    start = int(match.group(1))
    stop = min(int(match.group(2)) + 1, size) if match.group(2) else size
    if start >= size or start >= stop:
        raise HubError(416, f"Range {header} not satisfiable for {size} bytes")
    return start, stop


class LoopbackHub:
    """A Hub on 127.0.0.1 for the real client; see the module docstring."""

    user = "loopback-user"

    def __init__(self, *, lfs_threshold: int = 10 * 1024 * 1024) -> None:
        self.lfs_threshold = lfs_threshold
        self.repos: dict[str, HubRepo] = {}
        self.lfs_objects: dict[str, bytes] = {}
        self.requests: list[RecordedRequest] = []
        self.unhandled: list[RecordedRequest] = []
        self.port = 0
        self._lock = threading.RLock()
        self._failures: list[_Failure] = []
        self._outage_on: str | None = None
        self._token: str | None = None
        self._cuts: list[list[Any]] = []  # [path part, bytes to send before dropping (None: half), times left]
        self._corruptions: Counter[str] = Counter()  # path part -> GETs left that send wrong bytes
        self._ranges_ignored: Counter[str] = Counter()  # path part -> ranged GETs left answered in full
        self._down = False  # set the moment an outage starts, before the socket is closed
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._server is not None and not self._down

    def start(self) -> None:
        """Serve (again) on the same port; the first start picks a free port."""
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._down = False
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Go down: new connections are refused until `start()`."""
        self._down = True
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    # -- test hooks --------------------------------------------------------------------

    def fail_next(self, n: int, status: int, path_part: str | None = None) -> None:
        """Answer the next n requests (whose path contains path_part, if given) with `status`."""
        with self._lock:
            self._failures.append(_Failure(n, status, path_part))

    def outage_on(self, path_part: str) -> None:
        """When a request whose path contains path_part arrives: drop it and stop the server."""
        self._outage_on = path_part

    def require_token(self, token: str | None) -> None:
        """Refuse (401) requests that do not carry `Authorization: Bearer <token>`."""
        self._token = token

    def add_dataset(self, repo_id: str, source: Path | Mapping[str, bytes], *, tags: Iterable[str] = ("v3.0",),
                    gated: bool = False, private: bool = False, branch: str = "main") -> str:
        """Commit a folder (or {path: bytes}) as the whole tree of `branch` of dataset repo_id
        (created if needed, with access control), tag that commit; returns its sha."""
        files = _files_of(source)
        with self._lock:
            repo = self.repos.get(repo_id)
            if repo is None:
                repo = self.repos[repo_id] = HubRepo(repo_id, "dataset", private, granted=set())
            repo.private, repo.gated = private, gated
            if repo.granted is None:
                repo.granted = set()
            tree = {path: StoredFile(data, lfs=self._upload_mode(path, len(data)) == "lfs") for path, data in files.items()}
            for stored in tree.values():
                if stored.lfs:
                    self.lfs_objects[hashlib.sha256(stored.data).hexdigest()] = stored.data
            sha = self._record_commit(repo, branch, tree, f"add_dataset {len(files)} files", list(files), [])
            for tag in tags:
                repo.tags[tag] = sha
        return sha

    def tag(self, repo_id: str, tag: str, revision: str = "main") -> str:
        """Point `tag` at the commit `revision` names; returns that sha."""
        with self._lock:
            repo = self._repo(repo_id)
            sha = self._resolve(repo, revision)[1]
            if sha is None:
                raise ValueError(f"{repo_id}@{revision} has no commit to tag")
            repo.tags[tag] = sha
        return sha

    def grant(self, repo_id: str, token: str) -> None:
        """Give `token` access to a private or gated repo (for a gated one: its terms accepted)."""
        with self._lock:
            repo = self._repo(repo_id)
            repo.granted = (repo.granted or set()) | {token}

    def cut_next(self, path_part: str, after: int | None = None, times: int = 1) -> None:
        """The next `times` GETs of a file whose path contains path_part send `after` bytes
        (default half) of the announced length, then drop the connection."""
        with self._lock:
            self._cuts.append([path_part, after, times])

    def corrupt_next(self, path_part: str, times: int = 1) -> None:
        """The next `times` GETs of a file whose path contains path_part send wrong bytes (same
        length, same headers)."""
        with self._lock:
            self._corruptions[path_part] += times

    def ignore_range_next(self, path_part: str, times: int = 1) -> None:
        """The next `times` GETs with a `Range` of a file whose path contains path_part get the
        whole file with a 200, as a server that ignores `Range` answers."""
        with self._lock:
            self._ranges_ignored[path_part] += times

    def downloads(self, repo_id: str) -> Counter[str]:
        """How many GETs each file of repo_id got on its resolve URL (whatever the answer)."""
        counts: Counter[str] = Counter()
        for record in list(self.requests):
            target = self._resolve_target(record.path)
            if record.method == "GET" and target is not None and target[0] == repo_id:
                counts[target[2]] += 1
        return counts

    def requests_per_path(self, method: str | None = None) -> Counter[str]:
        return Counter(r.path for r in list(self.requests) if method is None or r.method == method)

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        repo = self.repos[repo_id]
        return {path: f.data for path, f in sorted(repo.trees[revision].items())}

    def lfs_paths(self, repo_id: str, revision: str = "main") -> set[str]:
        return {path for path, f in self.repos[repo_id].trees[revision].items() if f.lfs}

    def paths_requested(self, method: str | None = None) -> list[str]:
        return [r.path for r in self.requests if method is None or r.method == method]

    def committed_paths(self, repo_id: str) -> list[str]:
        """Every path any commit to repo_id added, in order (what was actually sent)."""
        return [p for c in self.repos[repo_id].commits for p in c["added"]] if repo_id in self.repos else []

    # -- request handling (called from handler threads) --------------------------------

    def _take_failure(self, path: str) -> int | None:
        with self._lock:
            for failure in self._failures:
                if failure.remaining > 0 and (failure.path_part is None or failure.path_part in path):
                    failure.remaining -= 1
                    return failure.status
        return None

    def _check_auth(self, headers: dict[str, str]) -> None:
        if self._token is not None and headers.get("authorization") != f"Bearer {self._token}":
            raise HubError(401, "Invalid credentials in Authorization header")

    def handle(self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        """Route one request; returns (status, headers, body)."""
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts[0] != "lfs-upload":  # upload hrefs stand for presigned storage URLs: no Hub token
            self._check_auth(headers)
        if method == "POST" and parts == ["api", "repos", "create"]:
            return self._json(self._create_repo(json.loads(body)))
        if method == "GET" and parts == ["api", "whoami-v2"]:
            return self._json({"type": "user", "name": self.user, "auth": {"accessToken": {"role": "write"}}})
        if method == "POST" and parts == ["api", "validate-yaml"]:
            return self._validate_yaml(json.loads(body))
        if method == "PUT" and len(parts) == 2 and parts[0] == "lfs-upload":
            return self._lfs_put(parts[1], body)
        if len(parts) >= 4 and parts[0] == "api" and parts[1] in _REPO_TYPES:
            known = self.repos.get("/".join(parts[2:4]))
            if method == "GET" and known is not None:
                self._check_read_access(known, headers, content=False)
            return self._repo_api(method, parts[1], "/".join(parts[2:4]), parts[4:], body, query)
        target = self._resolve_target(path)
        if target is not None and method in ("GET", "HEAD"):
            return self._resolve_file(method, path, *target, headers)
        lfs = re.fullmatch(r"(?:(datasets|spaces)/)?([^/]+/[^/]+)\.git/info/lfs/objects/(batch|verify)", path.strip("/"))
        if lfs and method == "POST":
            repo = self._repo(unquote(lfs.group(2)))
            return self._lfs_batch(repo, json.loads(body)) if lfs.group(3) == "batch" else self._lfs_verify(json.loads(body))
        raise HubError(404, f"loopback hub: no route for {method} {path}", "Unhandled")

    def _repo_api(self, method: str, kind: str, repo_id: str, rest: list[str], body: bytes,
                  query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        if not rest and method == "GET":
            return self._json(self._repo_info(self._repo(repo_id), "main"))
        action = rest[0]
        if method == "GET" and action == "revision" and len(rest) == 2:
            repo = self._repo(repo_id)
            return self._json(self._repo_info(repo, rest[1]))
        if method == "GET" and action == "tree" and len(rest) >= 2:
            repo = self._repo(repo_id)
            return self._json(self._tree(repo, rest[1], "/".join(rest[2:]), query))
        if method == "PUT" and action == "settings" and len(rest) == 1:
            return self._json(self._settings(self._repo(repo_id), json.loads(body or b"{}")))
        if method == "GET" and action == "refs":
            repo = self._repo(repo_id)
            branches = [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": repo.heads.get(b, "")} for b in repo.trees]
            tags = [{"name": t, "ref": f"refs/tags/{t}", "targetCommit": sha} for t, sha in sorted(repo.tags.items())]
            return self._json({"branches": branches, "converts": [], "tags": tags})
        if method == "POST" and action == "branch" and len(rest) == 2:
            return self._create_branch(self._repo(repo_id), rest[1], json.loads(body or b"{}"))
        if method == "POST" and action == "preupload" and len(rest) == 2:
            repo = self._repo(repo_id)
            return self._json(self._preupload(repo, self._branch(repo, rest[1]), json.loads(body)))
        if method == "POST" and action == "commit" and len(rest) == 2:
            repo = self._repo(repo_id)
            return self._json(self._commit(repo, self._branch(repo, rest[1]), body))
        if action == "xet-write-token":
            raise HubError(501, "the loopback hub has no Xet storage: set HF_HUB_DISABLE_XET=1 (the hub_server fixture does)")
        raise HubError(404, f"loopback hub: no route for {method} /api/{kind}/{repo_id}/{'/'.join(rest)}", "Unhandled")

    @staticmethod
    def _json(data: Any, status: int = 200) -> tuple[int, dict[str, str], bytes]:
        return status, {"Content-Type": "application/json"}, json.dumps(data).encode()

    def _repo(self, repo_id: str) -> HubRepo:
        with self._lock:
            if repo_id not in self.repos:
                raise HubError(404, f"Repository {repo_id} not found", "RepoNotFound")
            return self.repos[repo_id]

    @staticmethod
    def _branch(repo: HubRepo, revision: str) -> str:
        if revision not in repo.trees:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return revision

    @staticmethod
    def _resolve(repo: HubRepo, revision: str) -> tuple[dict[str, StoredFile], str | None]:
        """The tree and commit sha a branch, a tag or a commit sha names."""
        if revision in repo.trees:
            return repo.trees[revision], repo.heads.get(revision)
        sha = repo.tags.get(revision, revision)
        if sha in repo.snapshots:
            return repo.snapshots[sha], sha
        raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")

    @staticmethod
    def _resolve_target(path: str) -> tuple[str, str, str] | None:
        """(repo_id, revision, file path) of a `/[{type}s/]{id}/resolve/{rev}/{path}` URL."""
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts and parts[0] in _REPO_TYPES:
            parts = parts[1:]
        if len(parts) < 5 or parts[2] != "resolve":
            return None
        return "/".join(parts[:2]), parts[3], "/".join(parts[4:])

    def _check_read_access(self, repo: HubRepo, headers: dict[str, str], *, content: bool) -> None:
        """The real Hub's answers for private and gated repos (see the module docstring)."""
        if repo.granted is None:
            return
        auth = headers.get("authorization", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        if token in repo.granted:
            return
        if repo.private:
            if token is None:
                raise HubError(401, "Invalid username or password.", "RepoNotFound")
            raise HubError(404, f"Repository Not Found for url: {repo.repo_id}", "RepoNotFound")
        if repo.gated and content:
            if token is None:
                raise HubError(401, f"Access to dataset {repo.repo_id} is restricted. You must have access to it and "
                                    "be authenticated to access it. Please log in.", "GatedRepo")
            raise HubError(403, f"Access to dataset {repo.repo_id} is restricted and you are not in the authorized "
                                f"list. Visit {self.endpoint}/datasets/{repo.repo_id} to ask for access.", "GatedRepo")

    def _resolve_file(self, method: str, path: str, repo_id: str, revision: str, file_path: str,
                      headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        """A file's bytes as the Hub serves them: the headers `hf_hub_download` reads, ranges."""
        repo = self._repo(repo_id)
        self._check_read_access(repo, headers, content=True)
        with self._lock:
            tree, sha = self._resolve(repo, revision)
            stored = tree.get(file_path)
        if stored is None:
            raise HubError(404, f"Entry Not Found for url: {path}", "EntryNotFound")
        data = stored.data
        etag = hashlib.sha256(data).hexdigest() if stored.lfs else _git_sha1(data)
        out = {"ETag": f'"{etag}"', "X-Repo-Commit": sha or "", "Accept-Ranges": "bytes",
               "Content-Type": "application/octet-stream"}
        if stored.lfs:
            out["X-Linked-Etag"], out["X-Linked-Size"] = f'"{etag}"', str(len(data))
        status, body = 200, data
        if method == "GET":
            body = self._tampered(path, data)
            span = _byte_range(headers.get("range"), len(data))
            if span is not None and self._take_ignored_range(path):
                span = None
            if span is not None:
                status, body = 206, body[span[0]:span[1]]
                out["Content-Range"] = f"bytes {span[0]}-{span[1] - 1}/{len(data)}"
            cut = self._take_cut(path)
            if cut is not None:
                out[_CUT_AFTER] = str(len(body) // 2 if cut < 0 else min(cut, len(body)))
        out["Content-Length"] = str(len(body))
        return status, out, body

    def _tampered(self, path: str, data: bytes) -> bytes:
        with self._lock:
            hit = next((part for part, left in self._corruptions.items() if left > 0 and part in path), None)
            if hit is None:
                return data
            self._corruptions[hit] -= 1
        return bytes(b ^ 0x5A for b in data)

    def _take_ignored_range(self, path: str) -> bool:
        with self._lock:
            hit = next((part for part, left in self._ranges_ignored.items() if left > 0 and part in path), None)
            if hit is None:
                return False
            self._ranges_ignored[hit] -= 1
        return True

    def _take_cut(self, path: str) -> int | None:
        """Bytes to send before dropping (-1: half), or None for a whole answer."""
        with self._lock:
            hit = next((cut for cut in self._cuts if cut[2] > 0 and cut[0] in path), None)
            if hit is None:
                return None
            hit[2] -= 1
        return -1 if hit[1] is None else int(hit[1])

    def _create_repo(self, payload: dict[str, Any]) -> dict[str, Any]:
        repo_id = f"{payload.get('organization') or self.user}/{payload['name']}"
        repo_type = payload.get("type") or "model"
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        url = f"{self.endpoint}/{prefix}{repo_id}"
        with self._lock:
            if repo_id in self.repos:
                raise HubError(409, "You already created this model repo", url=url)
            self.repos[repo_id] = HubRepo(repo_id, repo_type, payload.get("visibility") == "private")
        return {"url": url, "name": repo_id, "id": repo_id}

    def _repo_info(self, repo: HubRepo, revision: str) -> dict[str, Any]:
        with self._lock:
            tree, sha = self._resolve(repo, revision)
            paths = sorted(tree)
        return {
            "id": repo.repo_id,
            "sha": sha,
            "private": repo.private,
            "gated": "auto" if repo.gated else False,
            "siblings": [{"rfilename": p} for p in paths],
        }

    def _tree(self, repo: HubRepo, revision: str, path: str, query: dict[str, list[str]]) -> list[dict[str, Any]]:
        """The Hub's tree listing: the entries directly under `path` (every one below it with
        `recursive=true`), folders as `directory` entries, LFS files with their `lfs` pointer."""
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        with self._lock:
            tree = dict(self._resolve(repo, revision)[0])
        if prefix and not any(p.startswith(prefix) for p in tree):
            raise HubError(404, f"Path {path} not found in {revision}", "EntryNotFound")
        entries: dict[str, dict[str, Any]] = {}
        for file_path, stored in sorted(tree.items()):
            if not file_path.startswith(prefix):
                continue
            rest = file_path[len(prefix):].split("/")
            for depth in range(1, len(rest)):  # the folders on the way to the file
                folder = prefix + "/".join(rest[:depth])
                if depth == 1 or recursive:
                    entries.setdefault(folder, {"type": "directory", "oid": hashlib.sha1(folder.encode()).hexdigest(), "path": folder})
            if len(rest) == 1 or recursive:
                entry: dict[str, Any] = {"type": "file", "oid": _git_sha1(stored.data), "size": len(stored.data), "path": file_path}
                if stored.lfs:
                    entry["lfs"] = {"oid": hashlib.sha256(stored.data).hexdigest(), "size": len(stored.data), "pointerSize": 134}
                entries[file_path] = entry
        return [entries[p] for p in sorted(entries)]

    def _settings(self, repo: HubRepo, payload: dict[str, Any]) -> dict[str, Any]:
        visibility = payload.get("visibility")
        if visibility not in (None, "public", "private"):
            raise HubError(400, f"visibility must be public or private for a {repo.repo_type} repo, got {visibility!r}")
        with self._lock:
            if visibility is not None:
                repo.private = visibility == "private"
        return {}

    def _create_branch(self, repo: HubRepo, branch: str, payload: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        start = self._branch(repo, payload.get("startingPoint") or "main")
        with self._lock:
            if branch in repo.trees:
                raise HubError(409, f"Reference refs/heads/{branch} already exists")
            repo.trees[branch] = dict(repo.trees[start])
            if start in repo.heads:
                repo.heads[branch] = repo.heads[start]
        return self._json({})

    def _validate_yaml(self, payload: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        import yaml

        content: str = payload["content"]
        match = re.match(r"^---\s*\n(.*?)\n---\s*\n", content, re.DOTALL)
        if match is None:
            return self._json({"errors": [], "warnings": [{"message": "empty or missing yaml metadata in repo card"}]})
        try:
            meta = yaml.safe_load(match.group(1))
        except yaml.YAMLError as exc:
            return self._json({"errors": [{"message": f"invalid YAML: {exc}"}], "warnings": []}, 400)
        if not isinstance(meta, dict):
            return self._json({"errors": [{"message": "metadata must be a YAML mapping"}], "warnings": []}, 400)
        return self._json({"errors": [], "warnings": []})

    def _record_commit(self, repo: HubRepo, branch: str, tree: dict[str, StoredFile], summary: str,
                       added: list[str], deleted: list[str], salt: bytes = b"") -> str:
        """Make `tree` the new head of `branch` (its tree kept under the new sha); returns the sha."""
        with self._lock:
            parent = repo.heads.get(branch, "")
            sha = hashlib.sha1(f"{parent}{len(repo.commits)}{salt!r}{summary}".encode()).hexdigest()
            repo.trees[branch] = tree
            repo.heads[branch] = sha
            repo.snapshots[sha] = dict(tree)
            repo.commits.append({"sha": sha, "branch": branch, "summary": summary, "added": added, "deleted": deleted})
        return sha

    def _upload_mode(self, path: str, size: int) -> str:
        return "lfs" if path.endswith(_LFS_SUFFIXES) or size >= self.lfs_threshold else "regular"

    def _preupload(self, repo: HubRepo, branch: str, payload: dict[str, Any]) -> dict[str, Any]:
        files = []
        for item in payload["files"]:
            stored = repo.trees[branch].get(item["path"])
            oid = None
            if stored is not None:
                oid = hashlib.sha256(stored.data).hexdigest() if stored.lfs else _git_sha1(stored.data)
            mode = self._upload_mode(item["path"], item["size"])
            files.append({"path": item["path"], "uploadMode": mode, "shouldIgnore": False, "oid": oid})
        return {"files": files, "commitOid": repo.heads.get(branch)}

    def _lfs_batch(self, repo: HubRepo, payload: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        objects = []
        for obj in payload["objects"]:
            entry: dict[str, Any] = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if obj["oid"] not in self.lfs_objects:
                verify = f"{self.endpoint}/{repo.repo_id}.git/info/lfs/objects/verify"
                entry["actions"] = {
                    "upload": {"href": f"{self.endpoint}/lfs-upload/{obj['oid']}", "header": {}},
                    "verify": {"href": verify, "header": {}},
                }
            objects.append(entry)
        status, headers, body = self._json({"transfer": "basic", "objects": objects})
        headers["Content-Type"] = "application/vnd.git-lfs+json"
        return status, headers, body

    def _lfs_put(self, oid: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        if hashlib.sha256(body).hexdigest() != oid:
            raise HubError(400, f"uploaded bytes do not hash to {oid}")
        with self._lock:
            self.lfs_objects[oid] = body
        return 200, {}, b""

    def _lfs_verify(self, payload: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        data = self.lfs_objects.get(payload["oid"])
        if data is None or len(data) != payload["size"]:
            raise HubError(404, f"LFS object {payload['oid']} not found")
        return self._json({})

    def _commit(self, repo: HubRepo, branch: str, body: bytes) -> dict[str, Any]:
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "commit payload must start with a header line")
        with self._lock:
            tree = dict(repo.trees[branch])
            added: list[str] = []
            deleted: list[str] = []
            for line in lines[1:]:
                key, value = line["key"], line["value"]
                if key == "file":
                    tree[value["path"]] = StoredFile(base64.b64decode(value["content"]), lfs=False)
                elif key == "lfsFile":
                    if value["oid"] not in self.lfs_objects:
                        raise HubError(422, f"LFS object {value['oid']} for {value['path']} was never uploaded")
                    tree[value["path"]] = StoredFile(self.lfs_objects[value["oid"]], lfs=True)
                elif key == "deletedFile":
                    if value["path"] not in tree:
                        raise HubError(404, f"cannot delete {value['path']}: no such file on {branch}", "EntryNotFound")
                    tree.pop(value["path"])
                    deleted.append(value["path"])
                    continue
                elif key == "deletedFolder":
                    gone = [p for p in tree if p.startswith(value["path"].rstrip("/") + "/")]
                    tree = {p: f for p, f in tree.items() if p not in gone}
                    deleted += gone
                    continue
                else:
                    raise HubError(400, f"unknown commit operation {key!r}")
                added.append(value["path"])
            sha = self._record_commit(repo, branch, tree, lines[0]["value"]["summary"], added, deleted, body)
        return {"commitUrl": f"{self.endpoint}/{repo.repo_id}/commit/{sha}", "commitOid": sha, "success": True, "pullRequestUrl": None}


class _Handler(BaseHTTPRequestHandler):
    hub: LoopbackHub

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline().strip():
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _serve(self) -> None:
        hub = self.hub
        url = urlsplit(self.path)
        body = self._body()
        headers = {k.lower(): v for k, v in self.headers.items()}
        shown = {k: ("<redacted>" if k in _SECRET_HEADERS else v) for k, v in headers.items()}
        record = RecordedRequest(self.command, url.path, parse_qs(url.query), shown, body)
        with hub._lock:
            hub.requests.append(record)
            if hub._outage_on is not None and hub._outage_on in url.path:
                hub._outage_on = None
                hub._down = True
                threading.Thread(target=hub.stop, daemon=True).start()
        if hub._down:  # drop the request unanswered, as a dying server does
            self.close_connection = True
            return
        failure = hub._take_failure(url.path)
        try:
            if failure is not None:
                raise HubError(failure, f"loopback hub: injected HTTP {failure}")
            status, out_headers, out = hub.handle(self.command, url.path, record.query, headers, body)
        except HubError as err:
            status, out_headers, out = LoopbackHub._json({"error": err.message, **err.extra}, err.status)
            out_headers["X-Error-Message"] = err.message
            if err.code:
                out_headers["X-Error-Code"] = err.code
            if err.code == "Unhandled":
                hub.unhandled.append(record)
        record.status = status
        cut_after = out_headers.pop(_CUT_AFTER, None)
        self.send_response(status)
        for key, value in out_headers.items():
            self.send_header(key, value)
        if "Content-Length" not in out_headers:
            self.send_header("Content-Length", str(len(out)))
        self.send_header("X-Request-Id", f"loopback-{len(hub.requests)}")
        self.end_headers()
        if self.command == "HEAD":
            return
        if cut_after is not None:  # announce everything, send part, drop: a connection cut midway
            self.wfile.write(out[: int(cut_after)])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(out)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _serve


@pytest.fixture
def hub_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackHub]:
    """A running LoopbackHub; the client is set to its LFS path (see the module docstring)."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub = LoopbackHub()
    hub.start()
    try:
        yield hub
    finally:
        hub.stop()
