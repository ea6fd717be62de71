"""Dataset reader, demo generator, sampler and processors on generated data."""

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from lr_config import ConfigError, DatasetConfig, FeatureSpec

from lr_engine._data.dataset import DatasetError, LeRobotDataset, load_meta
from lr_engine._data.locate import resolve_dataset_root
from lr_engine import make_demo_dataset
from lr_engine._data.sampler import DataPosition, GlobalOrderBatchSampler, resume_position
from lr_engine._processors import Normalizer, load_processors, make_processors, save_processors


def test_demo_layout_matches_lerobot_v3(demo_dataset):
    info = json.loads((demo_dataset / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    for key in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
        assert key in info["features"]
    stats = json.loads((demo_dataset / "meta" / "stats.json").read_text())
    assert set(stats["action"]) >= {"min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99"}
    episodes = pq.read_table(demo_dataset / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
    assert {"episode_index", "tasks", "length", "data/chunk_index", "data/file_index", "dataset_from_index", "dataset_to_index"} <= set(episodes.column_names)
    data = pq.read_table(demo_dataset / "data" / "chunk-000" / "file-000.parquet")
    action_type = data.schema.field("action").type
    assert pa.types.is_fixed_size_list(action_type) and action_type.list_size == 2
    assert action_type.value_type == pa.float32()
    assert data.num_rows == info["total_frames"]


def test_demo_generation_is_deterministic(tmp_path):
    a = make_demo_dataset(tmp_path / "a", num_episodes=3)
    b = make_demo_dataset(tmp_path / "b", num_episodes=3)
    for rel in ("data/chunk-000/file-000.parquet", "meta/stats.json", "meta/info.json"):
        ta, tb = (a / rel).read_bytes(), (b / rel).read_bytes()
        assert ta == tb, rel


def test_action_windows_are_padded_at_episode_end(demo_dataset):
    ds = LeRobotDataset(demo_dataset, action_horizon=8)
    ep = np.asarray([int(ds[i]["episode_index"]) for i in range(len(ds))])
    last_of_first = int(np.nonzero(ep == ep[0])[0][-1])
    item = ds[last_of_first - 2]
    assert item["action_is_pad"].tolist() == [False, False, False] + [True] * 5
    # padded steps repeat the last real action
    assert torch.equal(item["action"][3], item["action"][2])
    assert torch.equal(ds[0]["action"][1], ds[1]["action"][0])


def test_images_decode_to_chw_floats(image_dataset):
    ds = LeRobotDataset(image_dataset, action_horizon=4, episodes=[1, 3])
    item = ds[0]
    img = item["observation.images.top"]
    assert img.shape == (3, 32, 32) and img.dtype == torch.float32
    assert 0.0 <= float(img.min()) and float(img.max()) <= 1.0
    assert set(int(e) for e in ds.episode_ids) == {1, 3}
    inputs, outputs = ds.meta.policy_features()
    assert inputs["observation.images.top"] == FeatureSpec("VISUAL", [3, 32, 32])
    assert outputs == {"action": FeatureSpec("ACTION", [2])}


def test_missing_episode_and_video_feature_without_videos_are_clear(tmp_path, demo_dataset):
    with pytest.raises(DatasetError, match="--dataset.episodes"):
        LeRobotDataset(demo_dataset, episodes=[999])
    root = tmp_path / "video"
    shutil.copytree(demo_dataset, root)
    info = json.loads((root / "meta" / "info.json").read_text())
    info["features"]["observation.images.cam"] = {"dtype": "video", "shape": [8, 8, 3], "names": None}
    (root / "meta" / "info.json").write_text(json.dumps(info))
    with pytest.raises(DatasetError, match=r"videos/observation.images.cam/chunk_index"):
        LeRobotDataset(root)  # the episodes table does not say where its frames are


def test_missing_data_file_and_info_are_named(tmp_path, demo_dataset, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a Hub dataset that is not cached, and no network
    root = tmp_path / "broken"
    shutil.copytree(demo_dataset, root)
    (root / "data" / "chunk-000" / "file-000.parquet").unlink()
    with pytest.raises(DatasetError, match="file-000.parquet"):
        LeRobotDataset(root)
    with pytest.raises(ConfigError, match="--dataset.root"):
        resolve_dataset_root(DatasetConfig(root=tmp_path / "nothing"))
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE=1 and .*someone/absent"):
        resolve_dataset_root(DatasetConfig(repo_id="someone/absent"))


def test_global_order_is_rank_independent():
    n, b = 50, 3
    single = GlobalOrderBatchSampler(n, seed=7, batch_size=2 * b, dp_world_size=1, dp_rank=0, start=DataPosition(0, 0))
    r0 = GlobalOrderBatchSampler(n, seed=7, batch_size=b, dp_world_size=2, dp_rank=0, start=DataPosition(0, 0))
    r1 = GlobalOrderBatchSampler(n, seed=7, batch_size=b, dp_world_size=2, dp_rank=1, start=DataPosition(0, 0))
    for whole, a, c, _ in zip(single, r0, r1, range(20)):
        assert whole == a + c


def test_resume_position_exact_and_not():
    pos, exact = resume_position(13, 8, 8, 100)
    assert exact and pos == DataPosition(1, 1)  # 12 steps per epoch
    pos, exact = resume_position(5, 8, 16, 100)  # offset 40 samples -> step 3 of 6 (rounded up)
    assert not exact and pos == DataPosition(0, 3)


def test_a_saved_position_wins_over_the_step_count():
    """Step 13 says (1, 1) at batch 8, but a checkpoint whose run changed its batch earlier records
    where it really is: epoch 2, 40 samples in (the step count is ignored)."""
    assert resume_position(13, 8, 8, 100, saved=(2, 40)) == (DataPosition(2, 5), True)
    assert resume_position(13, 8, 16, 100, saved=(2, 40)) == (DataPosition(2, 3), False)  # 40 -> 48: rounded up
    assert resume_position(13, 8, 16, 100, saved=(2, 96)) == (DataPosition(3, 0), False)  # past the last whole batch
    # a position the dataset no longer has (fewer frames now, e.g. other --dataset.episodes): the next epoch
    assert resume_position(13, 8, 8, 50, saved=(2, 80)) == (DataPosition(3, 0), False)


def test_position_after_wraps_into_the_next_epochs():
    sampler = GlobalOrderBatchSampler(100, seed=1, batch_size=8, dp_world_size=1, dp_rank=0, start=DataPosition(2, 10))
    assert sampler.position_after(0) == DataPosition(2, 10)
    assert sampler.position_after(2) == DataPosition(3, 0) and sampler.epoch_after(2) == 3
    assert sampler.position_after(27) == DataPosition(5, 1)


def test_processors_round_trip(tmp_path, demo_dataset):
    meta = load_meta(demo_dataset)
    inputs, outputs = meta.policy_features()
    pre, post = make_processors(inputs, outputs, {"STATE": "mean_std", "ENV": "min_max", "ACTION": "mean_std"}, meta.stats)
    save_processors(tmp_path, pre, post)
    pre2, post2 = load_processors(tmp_path)
    batch = {"observation.state": torch.randn(4, 2), "observation.environment_state": torch.rand(4, 2), "action": torch.randn(4, 3, 2)}
    a, b = pre(batch), pre2(batch)
    for k in batch:
        assert torch.equal(a[k], b[k])
    back = post2({"action": a["action"]})["action"]
    torch.testing.assert_close(back, batch["action"], rtol=1e-5, atol=1e-5)
    ds = LeRobotDataset(demo_dataset)
    env = torch.stack([ds[i]["observation.environment_state"] for i in range(len(ds))])
    scaled = pre({"observation.environment_state": env})["observation.environment_state"]
    assert float(scaled.min()) == pytest.approx(-1.0, abs=1e-5) and float(scaled.max()) == pytest.approx(1.0, abs=1e-5)
    assert isinstance(post2, Normalizer) and post2.inverse
