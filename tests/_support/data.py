"""Shared fixtures: small LeRobot v3 datasets made by the project's own generator."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def demo_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small state-only demo dataset (12 episodes)."""
    from lr_engine import make_demo_dataset

    return make_demo_dataset(tmp_path_factory.mktemp("ds") / "demo", num_episodes=12)


@pytest.fixture(scope="session")
def image_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small demo dataset with a 32x32 camera (4 episodes)."""
    from lr_engine import make_demo_dataset

    return make_demo_dataset(tmp_path_factory.mktemp("ds") / "demo_img", num_episodes=4, with_images=True)


@pytest.fixture(scope="session")
def video_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo with two cameras stored as AV1 video, as LeRobot records them (4 episodes, 24x32)."""
    from lr_engine import make_demo_dataset

    return make_demo_dataset(tmp_path_factory.mktemp("ds") / "demo_video", num_episodes=4, with_images=True, video=True,
                             cameras=("top", "wrist"), image_height=24, image_width=32)


@pytest.fixture
def lr_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty LR_CACHE_DIR so the embedded demo is generated fresh for the test."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("LR_CACHE_DIR", str(cache))
    return cache
