"""The guide's first command on a dataset that lives on the Hub: `lr-engine train --dataset.repo_id=<user>/<name>`
downloads it through the real `huggingface_hub` client (from the loopback Hub), on one process and under
two processes where one process per node downloads while the others wait, and a repo that cannot be had exits 2
before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _support.metrics import losses
from _support.procs import run_cli, run_ranks
from _support.runs import TINY

pytestmark = pytest.mark.multiprocess

REPO = "lr-test/reach_video"


def _env(hub_server, tmp_path: Path) -> dict[str, str]:
    return {"HF_ENDPOINT": hub_server.endpoint, "HF_HOME": str(tmp_path / "hf_home"), "LR_CACHE_DIR": str(tmp_path / "lr_cache"),
            "HF_HUB_DISABLE_XET": "1"}


def test_a_hub_video_dataset_is_downloaded_once_and_trained_on_by_two_processes(hub_server, video_dataset: Path, tmp_path: Path) -> None:
    hub_server.add_dataset(REPO, video_dataset)
    out = tmp_path / "run"
    proc = run_ranks(2, ["train", f"--dataset.repo_id={REPO}", f"--output_dir={out}", *TINY, "--steps=3", "--parallelism.dp_shard=2",
                            "--dataset.episodes=[0, 2]"], env=_env(hub_server, tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    counts = hub_server.downloads(REPO)
    assert counts and all(n == 1 for n in counts.values()), counts  # one process downloaded; the other waited
    assert {p for p in counts if p.startswith("videos/")} == {"videos/observation.images.top/chunk-000/file-000.mp4",
                                                              "videos/observation.images.wrist/chunk-000/file-000.mp4"}
    assert len(losses(out)) == 3
    saved = json.loads((out / "train_config.json").read_text())["dataset"]
    assert saved["repo_id"] == REPO and "datasets--lr-test--reach_video" in saved["root"]  # the snapshot it trained on

    again = run_cli(["lr_engine.cli", "train", f"--dataset.repo_id={REPO}", f"--output_dir={tmp_path / 'again'}", *TINY, "--steps=1",
                     "--dataset.episodes=[0, 2]"], env=_env(hub_server, tmp_path))
    assert again.returncode == 0, again.stderr[-3000:]
    assert hub_server.downloads(REPO) == counts  # cached: nothing fetched again


def test_a_repo_that_cannot_be_had_exits_2_naming_it_and_writes_nothing(hub_server, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_cli(["lr_engine.cli", "train", "--dataset.repo_id=lr-test/no_such_dataset", f"--output_dir={out}", *TINY, "--steps=1"],
                   env=_env(hub_server, tmp_path))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "lr-test/no_such_dataset" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()
