"""Shared fixtures: a loopback Hugging Face Hub for the real `huggingface_hub` client.

`LoopbackHub` is a stdlib `ThreadingHTTPServer` on 127.0.0.1 (random port) that answers
the calls `HfApi(endpoint=hub.endpoint)` makes to create a repo and push a folder:

| request                                          | answer                                    |
|--------------------------------------------------|-------------------------------------------|
| `POST /api/repos/create`                         | creates `ns/name` (409 when it exists)    |
| `GET  /api/{type}s/{id}[/revision/{rev}]`        | repo info: sha, private, siblings         |
| `GET  /api/{type}s/{id}/refs`                    | branches                                  |
| `GET  /api/{type}s/{id}/tree/{rev}[/{path}]`     | entries (all below, with `recursive`)     |
| `PUT  /api/{type}s/{id}/settings`                | sets `visibility` (private or public)     |
| `POST /api/{type}s/{id}/branch/{branch}`         | creates a branch from main (409 if there) |
| `POST /api/validate-yaml`                        | 400 when the README front matter is bad   |
| `POST /api/{type}s/{id}/preupload/{rev}`         | `lfs` for weights or >= `lfs_threshold`   |
| `POST /{id}.git/info/lfs/objects/batch`          | basic-transfer upload + verify hrefs here |
| `PUT  /lfs-upload/{oid}`                         | stores the bytes (sha256 checked)         |
| `POST /{id}.git/info/lfs/objects/verify`         | 200 when the object is stored             |
| `POST /api/{type}s/{id}/commit/{rev}`            | NDJSON: `file` (base64), `lfsFile`, deletes |
| `GET  /api/whoami-v2`                            | a fixed user                              |

Anything else is a 404 and lands in `hub.unhandled`. State (repos, LFS objects) lives in
the `LoopbackHub` object, so `stop()` then `start()` simulates an outage on the same port.

Xet: huggingface_hub 2.4 sends every LFS-mode file through the Xet protocol when hf_xet is
installed, and Xet's CAS server cannot be imitated here. The `hub_server` fixture therefore
sets `HF_HUB_DISABLE_XET=1` (environment, for subprocesses, and the already-imported
constant, in-process), which makes the same client use the git-LFS batch API instead. The
xet token route answers 501 with that advice.

Test hooks: `hub.files(repo_id)` (bytes per path on a branch), `hub.requests` (method, path,
headers with the Authorization value redacted, body), `hub.fail_next(n, status)` (the next n
matching requests get that status), `hub.outage_on(path_part)` (drop that request and go
down), `hub.require_token(token)` (401 for any other token). Each of `hub.repos[id].commits`
records the paths it `added` and `deleted`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
            return self._repo_api(method, parts[1], "/".join(parts[2:4]), parts[4:], body, query)
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
            return self._json(self._repo_info(repo, self._branch(repo, rest[1])))
        if method == "GET" and action == "tree" and len(rest) >= 2:
            repo = self._repo(repo_id)
            return self._json(self._tree(repo, self._branch(repo, rest[1]), "/".join(rest[2:]), query))
        if method == "PUT" and action == "settings" and len(rest) == 1:
            return self._json(self._settings(self._repo(repo_id), json.loads(body or b"{}")))
        if method == "GET" and action == "refs":
            repo = self._repo(repo_id)
            branches = [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": repo.heads.get(b, "")} for b in repo.trees]
            return self._json({"branches": branches, "converts": [], "tags": []})
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

    def _repo_info(self, repo: HubRepo, branch: str) -> dict[str, Any]:
        return {
            "id": repo.repo_id,
            "sha": repo.heads.get(branch),
            "private": repo.private,
            "siblings": [{"rfilename": p} for p in sorted(repo.trees[branch])],
        }

    def _tree(self, repo: HubRepo, branch: str, path: str, query: dict[str, list[str]]) -> list[dict[str, Any]]:
        """The Hub's tree listing: the entries directly under `path` (every one below it with
        `recursive=true`), folders as `directory` entries, LFS files with their `lfs` pointer."""
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        with self._lock:
            tree = dict(repo.trees[branch])
        if prefix and not any(p.startswith(prefix) for p in tree):
            raise HubError(404, f"Path {path} not found in {branch}", "EntryNotFound")
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
            parent = repo.heads.get(branch, "")
            sha = hashlib.sha1(f"{parent}{len(repo.commits)}{body!r}".encode()).hexdigest()
            repo.trees[branch] = tree
            repo.heads[branch] = sha
            repo.commits.append({"sha": sha, "branch": branch, "summary": lines[0]["value"]["summary"], "added": added,
                                 "deleted": deleted})
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
        self.send_response(status)
        for key, value in out_headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(out)))
        self.send_header("X-Request-Id", f"loopback-{len(hub.requests)}")
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_DELETE = _serve


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
