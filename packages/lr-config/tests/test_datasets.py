"""lr_config.datasets: where a dataset is on this machine, and what a policy takes from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lr_config import ConfigError, FeatureSpec
from lr_config.datasets import cached_dataset_ids, demo_root, hub_cache_dir, locate_meta, policy_features

INFO = {
    "fps": 10,
    "total_episodes": 2,
    "total_frames": 20,
    "features": {
        "observation.state": {"dtype": "float32", "shape": [4]},
        "observation.environment_state": {"dtype": "float32", "shape": [2]},
        "observation.images.top": {"dtype": "video", "shape": [48, 64, 3]},
        "observation.velocity": {"dtype": "float32", "shape": [2]},
        "action": {"dtype": "float32", "shape": [2]},
        "timestamp": {"dtype": "float32", "shape": [1]},
        "episode_index": {"dtype": "int64", "shape": [1]},
    },
}


@pytest.fixture
def caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, folder in (("LR_CACHE_DIR", "lr"), ("HF_HUB_CACHE", "hub"), ("HF_LEROBOT_HOME", "lerobot")):
        monkeypatch.setenv(name, str(tmp_path / folder))
    return tmp_path


def meta(folder: Path) -> Path:
    (folder / "meta").mkdir(parents=True)
    (folder / "meta" / "info.json").write_text(json.dumps(INFO))
    return folder


def snapshot(cache: Path, repo_id: str, commit: str, ref: str | None = "main") -> Path:
    folder = cache / f"datasets--{repo_id.replace('/', '--')}"
    if ref is not None:
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / ref).write_text(commit)
    return meta(folder / "snapshots" / commit)


def test_the_rule_that_makes_policy_features() -> None:
    found = policy_features(INFO, "info.json")
    assert found.inputs == {
        "observation.state": FeatureSpec("STATE", [4]),
        "observation.environment_state": FeatureSpec("ENV", [2]),
        "observation.images.top": FeatureSpec("VISUAL", [3, 48, 64]),
    }
    assert found.outputs == {"action": FeatureSpec("ACTION", [2])} and found.ignored == ["observation.velocity"]
    with pytest.raises(ConfigError, match="info.json: the dataset has no 'action' feature"):
        policy_features({"features": {"observation.state": {"dtype": "float32", "shape": [2]}}}, "info.json")
    with pytest.raises(ConfigError, match="no observation"):
        policy_features({"features": {"action": {"dtype": "float32", "shape": [2]}}}, "info.json")


def test_each_place_a_dataset_can_be(caches: Path) -> None:
    local = meta(caches / "mine")
    assert locate_meta("x/y", local).where == "local"
    assert locate_meta("x/y", caches / "nowhere").note == f"--dataset.root: {caches / 'nowhere'} does not exist"
    assert locate_meta("lr/demo_reach2d", None).meta_dir is None
    meta(demo_root())
    assert locate_meta("lr/demo_reach2d", None).meta_dir == demo_root()
    meta(caches / "lerobot" / "org" / "copied")
    assert locate_meta("org/copied", None).where == "lerobot"
    assert locate_meta("org/copied", None, revision="v3.0").where == "not-cached"  # a revision is never LeRobot's copy
    snapshot(hub_cache_dir(), "org/cached", "a" * 40)
    snapshot(hub_cache_dir(), "org/cached", "b" * 40, ref="v3.0")
    found = locate_meta("org/cached", None)
    assert found.where == "hub-cache" and found.meta_dir is not None and found.meta_dir.name == "a" * 40
    assert locate_meta("org/cached", None, revision="v3.0").meta_dir.name == "b" * 40  # type: ignore[union-attr]
    assert locate_meta("org/cached", None, revision="c" * 40).where == "not-cached"
    assert cached_dataset_ids() == ["lr/demo_reach2d", "org/cached", "org/copied"]
