"""Downloading datasets from the Hub (`lr_engine._data.hub`) with the real huggingface_hub
client against the loopback Hub (`hub_server`, tests/_support/hub.py), into a cache under
tmp_path."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from huggingface_hub import constants, file_download, hf_hub_download, try_to_load_from_cache

from lr_engine import make_demo_dataset
from lr_engine._data import hub as dl
from lr_engine._data.dataset import LeRobotDataset
from lr_engine._data.errors import DatasetError

REPO = "lr-test/reach"
VIDEO_KEY = "observation.images.top"
META = {"meta/info.json", "meta/stats.json", "meta/tasks.parquet", "meta/episodes/chunk-000/file-000.parquet"}
DATA0, DATA1 = "data/chunk-000/file-000.parquet", "data/chunk-000/file-001.parquet"
VIDEO0 = f"videos/{VIDEO_KEY}/chunk-000/file-000.mp4"
VIDEO1 = f"videos/{VIDEO_KEY}/chunk-000/file-001.mp4"
SECRET = "hf_loopbackSecretToken0123456789"


# -- fixtures and helpers ----------------------------------------------------------------------


@pytest.fixture
def hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HF_HOME in tmp_path, no token and no login from the real home."""
    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    return home


@pytest.fixture
def log() -> list[str]:
    return []


@pytest.fixture
def no_retry_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub retries a refused listing 5 times over ~24 s, and a dropped download 5
    times a second apart (right for a real network); the retries still happen, without the waits."""
    import types

    from huggingface_hub.utils import _http

    fast = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("_")})
    fast.sleep = lambda _seconds: None
    monkeypatch.setattr(_http, "time", fast)
    monkeypatch.setattr(file_download, "time", fast)


def two_file_dataset(root: Path, *, videos: bool = False) -> Path:
    """The demo (4 episodes) split in two data files, episodes 0-1 and 2-3; with `videos`, a
    video feature whose (fake) files split the same way."""
    make_demo_dataset(root, num_episodes=4)
    data = pq.read_table(root / DATA0)
    pq.write_table(data.filter(pc.less(data["episode_index"], 2)), root / DATA0)
    pq.write_table(data.filter(pc.greater_equal(data["episode_index"], 2)), root / DATA1)
    episodes_path = root / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    episodes = pq.read_table(episodes_path)
    file_index = pa.array([0, 0, 1, 1], pa.int64())
    episodes = episodes.set_column(episodes.schema.get_field_index("data/file_index"), "data/file_index", file_index)
    if videos:
        info = json.loads((root / "meta" / "info.json").read_text())
        info["features"][VIDEO_KEY] = {"dtype": "video", "shape": [32, 32, 3], "names": ["height", "width", "channel"]}
        (root / "meta" / "info.json").write_text(json.dumps(info, indent=2))
        episodes = episodes.append_column(f"videos/{VIDEO_KEY}/chunk_index", pa.array([0] * 4, pa.int64()))
        episodes = episodes.append_column(f"videos/{VIDEO_KEY}/file_index", file_index)
        for i, rel in enumerate((VIDEO0, VIDEO1)):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(bytes((i * 7 + n) % 251 for n in range(5000)))
    pq.write_table(episodes, episodes_path)
    return root


def in_cache(snapshot: Path) -> set[str]:
    return {p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()}


def no_traceback(message: str) -> None:
    assert "Traceback" not in message and 'File "' not in message and "\n" not in message, message


def raised(fn, *args, **kwargs) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(DatasetError) as info:
        fn(*args, **kwargs)
    assert info.value.__cause__ is None and (info.value.__context__ is None or info.value.__suppress_context__)
    message = str(info.value)
    no_traceback(message)
    return message


@pytest.fixture
def videos_repo(hub_server, tmp_path: Path) -> tuple[str, Path]:  # type: ignore[no-untyped-def]
    """REPO on the hub: two data files and two video files; returns (commit, source folder)."""
    source = two_file_dataset(tmp_path / "src", videos=True)
    return hub_server.add_dataset(REPO, source), source


# -- downloading only what the run needs ------------------------------------------------------


def test_meta_first_then_only_the_files_of_the_selected_episodes(hub_server, hf_home, videos_repo, log):
    sha, source = videos_repo
    assert dl.resolve_revision(REPO, None, endpoint=hub_server.endpoint) == sha
    snapshot = dl.fetch_dataset(REPO, sha, [1], endpoint=hub_server.endpoint, log=log.append)

    assert snapshot == hf_home / "hub" / "datasets--lr-test--reach" / "snapshots" / sha
    assert in_cache(snapshot) == META | {DATA0, VIDEO0}
    for rel in in_cache(snapshot):
        assert (snapshot / rel).read_bytes() == (source / rel).read_bytes(), rel
    assert dict(hub_server.downloads(REPO)) == dict.fromkeys(META | {DATA0, VIDEO0}, 1)
    gets = [r.path.split(f"/{sha}/", 1)[1] for r in hub_server.requests if r.method == "GET" and "/resolve/" in r.path]
    assert set(gets[: len(META)]) == META  # the meta decides what else is needed
    assert hub_server.unhandled == []
    # logs (stderr is no terminal here): one line per file downloaded, path and size
    assert f"downloaded {REPO}/{DATA0} ({(source / DATA0).stat().st_size / 1000:.1f} kB)" in log
    assert sum(line.startswith("downloaded ") for line in log) == len(META) + 2


def test_all_episodes_by_default_and_a_second_call_downloads_nothing(hub_server, hf_home, videos_repo, log):
    sha, _ = videos_repo
    dl.fetch_dataset(REPO, sha, [0], endpoint=hub_server.endpoint)
    seen = len(hub_server.requests)
    snapshot = dl.fetch_dataset(REPO, sha, [0, 1], endpoint=hub_server.endpoint, log=log.append)
    assert hub_server.requests[seen:] == [] and log == []  # all cached: not even a listing request

    dl.fetch_dataset(REPO, sha, None, endpoint=hub_server.endpoint, log=log.append)
    assert in_cache(snapshot) == META | {DATA0, DATA1, VIDEO0, VIDEO1}
    assert dict(hub_server.downloads(REPO)) == dict.fromkeys(META | {DATA0, DATA1, VIDEO0, VIDEO1}, 1)
    assert max(hub_server.requests_per_path("HEAD").values()) == 1  # nothing cached was even looked up again
    assert sorted(line.split(" (")[0] for line in log if line.startswith("downloaded")) == [
        f"downloaded {REPO}/{DATA1}", f"downloaded {REPO}/{VIDEO1}"]


def test_the_snapshot_reads_as_a_dataset(hub_server, hf_home, tmp_path):
    source = two_file_dataset(tmp_path / "src")
    sha = hub_server.add_dataset(REPO, source)
    snapshot = dl.fetch_dataset(REPO, sha, [2, 3], endpoint=hub_server.endpoint, log=lambda _: None)
    assert in_cache(snapshot) == META | {DATA1}
    frames = LeRobotDataset(snapshot, episodes=[2, 3])
    assert sorted(set(frames.episode_ids.tolist())) == [2, 3]
    assert len(frames) == pq.read_table(source / DATA1).num_rows


def test_hf_hub_cache_is_where_files_go(hub_server, hf_home, videos_repo, tmp_path, monkeypatch):
    sha, _ = videos_repo
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    snapshot = dl.fetch_dataset(REPO, sha, [0], endpoint=hub_server.endpoint, log=lambda _: None)
    assert snapshot.is_relative_to(tmp_path / "elsewhere") and not (hf_home / "hub").exists()
    assert dl.cached_dataset(REPO, sha) == snapshot


def test_cached_dataset_needs_no_network(hub_server, hf_home, videos_repo):
    sha, _ = videos_repo
    assert dl.cached_dataset(REPO, sha) is None
    snapshot = dl.fetch_dataset(REPO, sha, [0], endpoint=hub_server.endpoint, log=lambda _: None)
    seen = len(hub_server.requests)
    assert dl.cached_dataset(REPO, sha) == snapshot
    assert dl.cached_dataset(REPO, "0" * 40) is None
    assert hub_server.requests[seen:] == []


def test_with_bars_on_a_terminal_there_is_no_line_per_file(hub_server, hf_home, videos_repo, log, monkeypatch):
    sha, _ = videos_repo
    monkeypatch.setattr(dl, "_bars_wanted", lambda: True)
    dl.fetch_dataset(REPO, sha, [0], endpoint=hub_server.endpoint, log=log.append)
    assert not any(line.startswith("downloaded ") for line in log)


def test_episodes_the_dataset_lacks_are_refused_by_flag(hub_server, hf_home, videos_repo):
    sha, _ = videos_repo
    message = raised(dl.fetch_dataset, REPO, sha, [1, 9], endpoint=hub_server.endpoint, log=lambda _: None)
    assert "--dataset.episodes" in message and "[9]" in message


def test_a_file_the_meta_names_but_the_repo_lacks_is_refused_before_downloading(hub_server, hf_home, tmp_path):
    source = two_file_dataset(tmp_path / "src")
    (source / DATA1).unlink()
    sha = hub_server.add_dataset(REPO, source)
    message = raised(dl.fetch_dataset, REPO, sha, None, endpoint=hub_server.endpoint, log=lambda _: None)
    assert DATA1 in message and "incomplete on the Hub" in message and "--dataset.revision" in message
    assert not any(k.startswith("data/") for k in hub_server.downloads(REPO))


# -- revisions ---------------------------------------------------------------------------------


def test_revision_by_tag_branch_or_commit_and_the_v3_tag_by_default(hub_server, hf_home, tmp_path):
    tagged = hub_server.add_dataset(REPO, make_demo_dataset(tmp_path / "a", num_episodes=4))  # tagged v3.0
    newer = hub_server.add_dataset(REPO, make_demo_dataset(tmp_path / "b", num_episodes=3), tags=())
    dev = hub_server.add_dataset(REPO, make_demo_dataset(tmp_path / "c", num_episodes=2), tags=(), branch="dev")
    endpoint = hub_server.endpoint

    assert dl.resolve_revision(REPO, None, endpoint=endpoint) == tagged  # as LeRobot: the codebase tag, not main
    assert dl.resolve_revision(REPO, "v3.0", endpoint=endpoint) == tagged
    assert dl.resolve_revision(REPO, "main", endpoint=endpoint) == newer
    assert dl.resolve_revision(REPO, "dev", endpoint=endpoint) == dev
    assert dl.resolve_revision(REPO, tagged, endpoint=endpoint) == tagged
    snapshot = dl.fetch_dataset(REPO, newer, None, endpoint=endpoint, log=lambda _: None)
    assert json.loads((snapshot / "meta" / "info.json").read_text())["total_episodes"] == 3
    assert (hf_home / "hub" / "datasets--lr-test--reach" / "refs" / "v3.0").read_text() == tagged  # for offline runs

    assert hub_server.tag(REPO, "v3.0", "main") == newer  # a retagged repo: the default follows the tag
    assert dl.resolve_revision(REPO, None, endpoint=endpoint) == newer

    message = raised(dl.resolve_revision, REPO, "v9-typo", endpoint=endpoint)
    assert "--dataset.revision" in message and "'v9-typo'" in message and REPO in message
    message = raised(dl.fetch_dataset, REPO, "f" * 40, None, endpoint=endpoint, log=lambda _: None)
    assert REPO in message and "--dataset.revision" in message


def test_without_a_v3_ref_main_is_used(hub_server, hf_home, tmp_path):
    head = hub_server.add_dataset(REPO, make_demo_dataset(tmp_path / "a", num_episodes=2), tags=("v2.1",))
    assert dl.resolve_revision(REPO, None, endpoint=hub_server.endpoint) == head
    old = hub_server.add_dataset("lr-test/other", make_demo_dataset(tmp_path / "b", num_episodes=2), tags=("v3",))
    hub_server.add_dataset("lr-test/other", make_demo_dataset(tmp_path / "c", num_episodes=3), tags=())
    assert dl.resolve_revision("lr-test/other", None, endpoint=hub_server.endpoint) == old


def test_the_ref_lerobot_would_pick():
    assert dl.codebase_ref(["main", "v2.1", "v3.0"]) == "v3.0"
    assert dl.codebase_ref(["main", "v3"]) == "v3"
    assert dl.codebase_ref(["v2.1", "v2.0", "main"]) is None  # LeRobot refuses (too old); lr takes main
    assert dl.codebase_ref(["v3.1", "v4.0"]) is None  # newer minor or major: LeRobot refuses too


def test_a_v2_dataset_is_refused_naming_the_revision_flag(hub_server, hf_home, tmp_path):
    root = make_demo_dataset(tmp_path / "old", num_episodes=2)
    info = json.loads((root / "meta" / "info.json").read_text())
    (root / "meta" / "info.json").write_text(json.dumps({**info, "codebase_version": "v2.1"}))
    sha = hub_server.add_dataset(REPO, root, tags=("v2.1",))
    message = raised(dl.fetch_dataset, REPO, dl.resolve_revision(REPO, None, endpoint=hub_server.endpoint), None,
                     endpoint=hub_server.endpoint, log=lambda _: None)
    assert "'v2.1'" in message and "--dataset.revision" in message and sha in message
    assert not any(k.startswith("data/") for k in hub_server.downloads(REPO))


# -- interrupted and corrupt downloads ---------------------------------------------------------


def test_a_download_cut_midway_resumes_with_a_range_request(hub_server, hf_home, videos_repo, monkeypatch, no_retry_waits):
    sha, source = videos_repo
    # huggingface_hub counts (and resumes from) the bytes it has read, in chunks of 10 MiB; small
    # chunks let a 5 kB file show the same resume
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 512)
    hub_server.cut_next(VIDEO0, after=2048)
    snapshot = dl.fetch_dataset(REPO, sha, [0], endpoint=hub_server.endpoint, log=lambda _: None)
    assert (snapshot / VIDEO0).read_bytes() == (source / VIDEO0).read_bytes()
    gets = [r for r in hub_server.requests if r.method == "GET" and r.path.endswith(VIDEO0)]
    size = (source / VIDEO0).stat().st_size
    assert size > 2048 and [(r.headers.get("range"), r.status) for r in gets] == [(None, 200), ("bytes=2048-", 206)]


def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub counts (and resumes from) the bytes it has read, in chunks of 10 MiB; small
    chunks let a 5 kB file show the same resume."""
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 512)


def fail_in_one_run(hub_server, hf_home: Path, sha: str, after: int) -> Path:  # type: ignore[no-untyped-def]
    """A fetch of episode 0 whose VIDEO0 download sends `after` bytes, then drops, and so does
    every retry huggingface_hub makes (with no byte more): the run fails. Returns the partial file."""
    retries = inspect.signature(file_download.http_get).parameters["_nb_retries"].default
    hub_server.cut_next(VIDEO0, after=after)
    hub_server.cut_next(VIDEO0, after=0, times=retries)
    message = raised(dl.fetch_dataset, REPO, sha, [0], endpoint=hub_server.endpoint, log=lambda _: None)
    assert REPO in message and "--dataset.root" in message
    gets = [r for r in hub_server.requests if r.method == "GET" and r.path.endswith(VIDEO0)]
    assert [r.headers.get("range") for r in gets] == [None] + [f"bytes={after}-"] * retries  # all cuts used
    folder = hf_home / "hub" / "datasets--lr-test--reach"
    assert not os.path.lexists(folder / "snapshots" / sha / VIDEO0)
    return folder / "blobs" / f"{hashlib.sha256(hub_server.files(REPO)[VIDEO0]).hexdigest()}.lr-partial"


def video_gets(hub_server, since: int) -> list[tuple[str | None, int]]:  # type: ignore[no-untyped-def]
    return [(r.headers.get("range"), r.status) for r in hub_server.requests[since:]
            if r.method == "GET" and r.path.endswith(VIDEO0)]


def test_a_download_failed_in_one_run_resumes_in_the_next(hub_server, hf_home, videos_repo, monkeypatch, log,
                                                         no_retry_waits):
    sha, source = videos_repo
    small_chunks(monkeypatch)
    video = (source / VIDEO0).read_bytes()
    partial = fail_in_one_run(hub_server, hf_home, sha, 2048)
    assert partial.read_bytes() == video[:2048]  # the run died; its bytes stay, under a name the next run knows

    seen = len(hub_server.requests)
    snapshot = dl.fetch_dataset(REPO, sha, [0], endpoint=hub_server.endpoint, log=log.append)
    assert video_gets(hub_server, seen) == [("bytes=2048-", 206)]
    assert (snapshot / VIDEO0).read_bytes() == video and not partial.exists()
    assert (snapshot / VIDEO0).is_symlink() and (snapshot / VIDEO0).resolve() == partial.with_suffix("")
    assert hub_server.downloads(REPO)[DATA0] == 1  # completed in the first run, kept
    assert any(line.startswith(f"{REPO}: resuming {VIDEO0}") for line in log)
    # where huggingface_hub itself (and LeRobot) looks for it, without the network
    cache = hf_home / "hub"
    assert try_to_load_from_cache(REPO, VIDEO0, cache_dir=cache, revision=sha, repo_type="dataset") == str(snapshot / VIDEO0)
    seen = len(hub_server.requests)
    assert hf_hub_download(REPO, VIDEO0, repo_type="dataset", revision=sha, cache_dir=cache,
                           endpoint=hub_server.endpoint) == str(snapshot / VIDEO0)
    assert hub_server.requests[seen:] == []


def test_a_partial_file_with_wrong_bytes_is_not_used(hub_server, hf_home, videos_repo, monkeypatch, log, no_retry_waits):
    sha, source = videos_repo
    small_chunks(monkeypatch)
    video = (source / VIDEO0).read_bytes()
    partial = fail_in_one_run(hub_server, hf_home, sha, 2048)
    partial.write_bytes(bytes(b ^ 0xFF for b in video[:2048]))  # damaged on disk between the runs

    seen = len(hub_server.requests)
    snapshot = dl.fetch_dataset(REPO, sha, [0], endpoint=hub_server.endpoint, log=log.append)
    assert video_gets(hub_server, seen) == [("bytes=2048-", 206), (None, 200)]  # resumed, failed the hash, fetched whole
    assert (snapshot / VIDEO0).read_bytes() == video and not partial.exists()
    assert any(VIDEO0 in line and "does not hash" in line and "fetching it again" in line for line in log)


def test_a_server_that_ignores_range_still_gives_the_right_file(hub_server, hf_home, videos_repo, monkeypatch,
                                                               no_retry_waits):
    sha, source = videos_repo
    small_chunks(monkeypatch)
    partial = fail_in_one_run(hub_server, hf_home, sha, 2048)
    hub_server.ignore_range_next(VIDEO0)

    seen = len(hub_server.requests)
    snapshot = dl.fetch_dataset(REPO, sha, [0], endpoint=hub_server.endpoint, log=lambda _: None)
    assert video_gets(hub_server, seen) == [("bytes=2048-", 200)]  # the whole file, read from its first byte
    assert (snapshot / VIDEO0).read_bytes() == (source / VIDEO0).read_bytes() and not partial.exists()


def test_a_blob_another_process_is_downloading_is_waited_for_and_used(hub_server, hf_home, videos_repo):
    from filelock import FileLock

    sha, source = videos_repo
    video = (source / VIDEO0).read_bytes()
    folder = hf_home / "hub" / "datasets--lr-test--reach"
    etag = hashlib.sha256(video).hexdigest()
    lock = folder.parent / ".locks" / folder.name / f"{etag}.lock"  # the lock hf_hub_download takes, too
    lock.parent.mkdir(parents=True)
    errors: list[BaseException] = []

    def fetch() -> None:
        try:
            dl.fetch_dataset(REPO, sha, [0], endpoint=hub_server.endpoint, log=lambda _: None)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    with FileLock(lock):  # another process holds the blob's lock
        worker = threading.Thread(target=fetch)
        worker.start()
        deadline = time.monotonic() + 30
        while not any(r.method == "HEAD" and r.path.endswith(VIDEO0) for r in list(hub_server.requests)):
            assert time.monotonic() < deadline and worker.is_alive(), errors
            time.sleep(0.02)
        time.sleep(0.3)
        assert not list((folder / "blobs").glob(f"{etag}*"))  # it waits: no partial file of its own
        (folder / "blobs" / etag).write_bytes(video)  # the other process completes the blob
    worker.join(30)
    assert not worker.is_alive() and errors == []
    assert (folder / "snapshots" / sha / VIDEO0).read_bytes() == video
    assert hub_server.downloads(REPO)[VIDEO0] == 0  # used, not downloaded again


def test_a_corrupt_download_is_fetched_again_and_never_used(hub_server, hf_home, videos_repo, log):
    sha, source = videos_repo
    hub_server.corrupt_next(DATA0)
    hub_server.corrupt_next("meta/info.json")
    snapshot = dl.fetch_dataset(REPO, sha, [0], endpoint=hub_server.endpoint, log=log.append)
    for rel in (DATA0, "meta/info.json"):
        assert (snapshot / rel).read_bytes() == (source / rel).read_bytes()
        assert hub_server.downloads(REPO)[rel] == 2
    assert any(DATA0 in line and "fetching it again" in line for line in log)


def test_a_download_corrupt_twice_raises_naming_the_file_and_keeps_nothing(hub_server, hf_home, videos_repo):
    sha, source = videos_repo
    hub_server.corrupt_next(VIDEO0, times=2)
    message = raised(dl.fetch_dataset, REPO, sha, [0], endpoint=hub_server.endpoint, log=lambda _: None)
    assert VIDEO0 in message and REPO in message and "--dataset.root" in message
    snapshot = hf_home / "hub" / "datasets--lr-test--reach" / "snapshots" / sha
    assert not os.path.lexists(snapshot / VIDEO0)
    blobs = hf_home / "hub" / "datasets--lr-test--reach" / "blobs"
    wrong = bytes(b ^ 0x5A for b in (source / VIDEO0).read_bytes())
    assert all(p.read_bytes() != wrong for p in blobs.iterdir())


@pytest.mark.parametrize("damage", ["same size", "truncated"])
def test_a_corrupt_cached_file_is_not_used(hub_server, hf_home, videos_repo, log, damage):
    sha, source = videos_repo
    snapshot = dl.fetch_dataset(REPO, sha, [0], endpoint=hub_server.endpoint, log=lambda _: None)
    blob = (snapshot / DATA0).resolve()
    before = blob.stat()
    good = blob.read_bytes()
    blob.chmod(0o644)
    blob.write_bytes(bytes(len(good)) if damage == "same size" else good[:-10])
    os.utime(blob, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))  # a rewrite, as the disk would show it

    dl.fetch_dataset(REPO, sha, [0], endpoint=hub_server.endpoint, log=log.append)
    assert (snapshot / DATA0).read_bytes() == (source / DATA0).read_bytes()
    assert hub_server.downloads(REPO)[DATA0] == 2
    assert any(f"cached {DATA0}" in line for line in log)


def test_a_cache_without_symlinks_is_checked_by_size(hub_server, hf_home, videos_repo, monkeypatch):
    """Windows without developer mode or HF_HUB_DISABLE_SYMLINKS=1: huggingface_hub keeps the
    files themselves in the snapshot, no blobs named by their hash; lr checks their sizes."""
    from huggingface_hub import file_download

    sha, source = videos_repo
    monkeypatch.setattr(file_download, "are_symlinks_supported", lambda *_args: False)
    snapshot = dl.fetch_dataset(REPO, sha, [0], endpoint=hub_server.endpoint, log=lambda _: None)
    assert not (snapshot / DATA0).is_symlink() and (snapshot / DATA0).read_bytes() == (source / DATA0).read_bytes()
    (snapshot / DATA0).write_bytes((source / DATA0).read_bytes()[:100])
    dl.fetch_dataset(REPO, sha, [0], endpoint=hub_server.endpoint, log=lambda _: None)
    assert (snapshot / DATA0).read_bytes() == (source / DATA0).read_bytes()
    assert hub_server.downloads(REPO)[DATA0] == 2


def test_files_are_hashed_once_and_trusted_after(hub_server, hf_home, videos_repo, monkeypatch):
    sha, _ = videos_repo
    hashed: list[str] = []
    real = dl._content_hash
    monkeypatch.setattr(dl, "_content_hash", lambda path, lfs: hashed.append(path.name) or real(path, lfs=lfs))
    dl.fetch_dataset(REPO, sha, [0], endpoint=hub_server.endpoint, log=lambda _: None)
    assert len(hashed) == len(META) + 2  # each file right after its download
    hashed.clear()
    dl.fetch_dataset(REPO, sha, [0], endpoint=hub_server.endpoint, log=lambda _: None)
    assert hashed == []  # later runs: a stat against the marker, no hashing


# -- errors ------------------------------------------------------------------------------------


def test_an_unknown_repo(hub_server, hf_home):
    message = raised(dl.resolve_revision, "lr-test/nope", None, endpoint=hub_server.endpoint)
    assert "--dataset.repo_id" in message and "'lr-test/nope'" in message and hub_server.endpoint in message
    assert "HF_TOKEN" in message  # it may be private


def test_a_private_repo_needs_a_token_with_access(hub_server, hf_home, videos_repo, tmp_path, monkeypatch):
    hub_server.add_dataset("lr-test/private", tmp_path / "src", private=True)
    message = raised(dl.resolve_revision, "lr-test/private", None, endpoint=hub_server.endpoint)
    assert "'lr-test/private'" in message and "private" in message and "HF_TOKEN" in message
    monkeypatch.setenv("HF_TOKEN", "hf_notGrantedToken0123456789")
    message = raised(dl.resolve_revision, "lr-test/private", None, endpoint=hub_server.endpoint)
    assert "'lr-test/private'" in message and "hf_notGranted" not in message


def test_a_gated_repo_without_a_token_or_without_access(hub_server, hf_home, videos_repo, tmp_path, monkeypatch):
    sha = hub_server.add_dataset("lr-test/gated", tmp_path / "src", gated=True)
    assert dl.resolve_revision("lr-test/gated", None, endpoint=hub_server.endpoint) == sha  # info is public
    message = raised(dl.fetch_dataset, "lr-test/gated", sha, [0], endpoint=hub_server.endpoint, log=lambda _: None)
    assert "gated" in message and "accept its terms" in message and "HF_TOKEN" in message and "hf auth login" in message
    assert f"{hub_server.endpoint}/datasets/lr-test/gated" in message

    monkeypatch.setenv("HF_TOKEN", "hf_notGrantedToken0123456789")
    message = raised(dl.fetch_dataset, "lr-test/gated", sha, [0], endpoint=hub_server.endpoint, log=lambda _: None)
    assert "not been granted" in message and "'lr-test/gated'" in message and "hf_notGranted" not in message

    hub_server.grant("lr-test/gated", "hf_notGrantedToken0123456789")
    snapshot = dl.fetch_dataset("lr-test/gated", sha, [0], endpoint=hub_server.endpoint, log=lambda _: None)
    assert DATA0 in in_cache(snapshot)


def test_a_rejected_token(hub_server, hf_home, videos_repo, monkeypatch):
    hub_server.require_token("hf_theRightOne0123456789")
    monkeypatch.setenv("HF_TOKEN", "hf_aWrongOne0123456789")
    message = raised(dl.resolve_revision, REPO, None, endpoint=hub_server.endpoint)
    assert "HTTP 401" in message and "HF_TOKEN" in message and REPO in message and "hf_aWrong" not in message


def test_an_unreachable_hub(hub_server, hf_home, videos_repo, no_retry_waits):
    sha, _ = videos_repo
    hub_server.stop()
    for call in (lambda: dl.resolve_revision(REPO, None, endpoint=hub_server.endpoint),
                 lambda: dl.fetch_dataset(REPO, sha, [0], endpoint=hub_server.endpoint, log=lambda _: None)):
        message = raised(call)
        assert hub_server.endpoint in message and "HF_ENDPOINT" in message and "--dataset.root" in message
        assert REPO in message and "could not be reached" in message


def test_a_hub_that_answers_5xx(hub_server, hf_home, videos_repo):
    hub_server.fail_next(20, 503, path_part="/api/")
    message = raised(dl.resolve_revision, REPO, None, endpoint=hub_server.endpoint)
    assert "HTTP 503" in message and hub_server.endpoint in message and "--dataset.root" in message


def test_hf_endpoint_is_read_at_call_time(hub_server, hf_home, videos_repo, monkeypatch):
    sha, _ = videos_repo
    monkeypatch.setenv("HF_ENDPOINT", hub_server.endpoint)
    assert dl.resolve_revision(REPO, None) == sha
    assert DATA0 in in_cache(dl.fetch_dataset(REPO, sha, [0], log=lambda _: None))


# -- offline -----------------------------------------------------------------------------------


def test_offline_with_the_cache_needs_no_request(hub_server, hf_home, videos_repo, monkeypatch):
    sha, _ = videos_repo
    snapshot = dl.fetch_dataset(REPO, dl.resolve_revision(REPO, None, endpoint=hub_server.endpoint), [0],
                                endpoint=hub_server.endpoint, log=lambda _: None)
    seen = len(hub_server.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert dl.resolve_revision(REPO, None, endpoint=hub_server.endpoint) == sha
    assert dl.resolve_revision(REPO, "v3.0", endpoint=hub_server.endpoint) == sha
    assert dl.fetch_dataset(REPO, sha, [0, 1], endpoint=hub_server.endpoint, log=lambda _: None) == snapshot
    assert hub_server.requests[seen:] == []

    message = raised(dl.fetch_dataset, REPO, sha, [2], endpoint=hub_server.endpoint, log=lambda _: None)
    assert "HF_HUB_OFFLINE=1" in message and DATA1 in message and REPO in message
    message = raised(dl.resolve_revision, REPO, "dev", endpoint=hub_server.endpoint)
    assert "HF_HUB_OFFLINE=1" in message and "'dev'" in message
    assert hub_server.requests[seen:] == []


def test_offline_with_nothing_cached(hub_server, hf_home, videos_repo, monkeypatch):
    sha, _ = videos_repo
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for call in (lambda: dl.resolve_revision(REPO, None, endpoint=hub_server.endpoint),
                 lambda: dl.fetch_dataset(REPO, sha, [0], endpoint=hub_server.endpoint, log=lambda _: None)):
        message = raised(call)
        assert "HF_HUB_OFFLINE=1" in message and REPO in message and "--dataset.root" in message
        assert str(hf_home / "hub") in message
    assert hub_server.requests == []


def test_a_hub_gone_down_after_a_download_still_serves_the_cache(hub_server, hf_home, videos_repo):
    sha, _ = videos_repo
    snapshot = dl.fetch_dataset(REPO, dl.resolve_revision(REPO, None, endpoint=hub_server.endpoint), [0],
                                endpoint=hub_server.endpoint, log=lambda _: None)
    hub_server.stop()
    assert dl.resolve_revision(REPO, None, endpoint=hub_server.endpoint) == sha
    assert dl.fetch_dataset(REPO, sha, [0], endpoint=hub_server.endpoint, log=lambda _: None) == snapshot


# -- the token ---------------------------------------------------------------------------------


def test_the_token_is_sent_but_never_written_or_printed(hub_server, hf_home, videos_repo, tmp_path, monkeypatch, log, capsys,
                                                        no_retry_waits):
    hub_server.add_dataset("lr-test/private", tmp_path / "src", private=True, gated=True)
    hub_server.grant("lr-test/private", SECRET)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    sha = dl.resolve_revision("lr-test/private", None, endpoint=hub_server.endpoint)
    dl.fetch_dataset("lr-test/private", sha, None, endpoint=hub_server.endpoint, log=log.append)
    hub_server.stop()
    raised(dl.fetch_dataset, "lr-test/other", sha, None, endpoint=hub_server.endpoint, log=log.append)

    assert all(r.headers.get("authorization") == "<redacted>" for r in hub_server.requests if "/resolve/" in r.path)
    written = [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()]
    assert written and not [p for p in written if SECRET.encode() in p.read_bytes()]
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err + "\n".join(log)
