"""The embedded demo dataset: a simulated 2-D reaching task with a scripted expert.

A point agent starts at a random position and moves toward a random target; the expert
action is the velocity command `clip(gain * (target - agent), -max_speed, max_speed)`.
Observations: `observation.state` (agent x, y), `observation.environment_state` (target
x, y) and, optionally, `observation.images.top` (a 32x32 RGB rendering). Action: (vx, vy).

`make_demo_dataset(root, ...)` writes it deterministically in LeRobot v3's layout (as
LeRobot 0.6's writer lays it out, images stored as PNG bytes). `ensure_demo_dataset()`
makes it once in the cache folder (`$LR_CACHE_DIR`, else `$XDG_CACHE_HOME/lr`, else
`~/.cache/lr`), written under a temporary name and renamed, so concurrent ranks or a crash
never leave a half dataset.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

DEMO_VERSION = 1
FPS = 10
IMAGE_SIZE = 32
_MARKER = f".lr_demo_v{DEMO_VERSION}"


def cache_dir() -> Path:
    if os.environ.get("LR_CACHE_DIR"):
        return Path(os.environ["LR_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lr"


def demo_root(repo_id: str) -> Path:
    return cache_dir() / "datasets" / repo_id


def _expert_episode(rng: np.random.Generator, length: int) -> dict[str, np.ndarray]:
    agent = rng.uniform(-1.0, 1.0, size=2)
    target = rng.uniform(-1.0, 1.0, size=2)
    states, actions = [], []
    for _ in range(length):
        action = np.clip(1.5 * (target - agent), -0.6, 0.6)
        states.append(agent.copy())
        actions.append(action)
        agent = np.clip(agent + action / FPS * 3.0, -1.0, 1.0)
    env = np.repeat(target[None, :], length, axis=0)
    return {
        "observation.state": np.asarray(states, dtype=np.float32),
        "observation.environment_state": env.astype(np.float32),
        "action": np.asarray(actions, dtype=np.float32),
    }


def _render(state: np.ndarray, target: np.ndarray) -> bytes:
    from PIL import Image

    img = np.full((IMAGE_SIZE, IMAGE_SIZE, 3), 24, dtype=np.uint8)

    def dot(pos: np.ndarray, color: tuple[int, int, int]) -> None:
        cx, cy = ((pos + 1.0) / 2.0 * (IMAGE_SIZE - 1)).round().astype(int)
        img[max(cy - 1, 0) : cy + 2, max(cx - 1, 0) : cx + 2] = color

    dot(target, (40, 220, 60))
    dot(state, (230, 50, 40))
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()


def _stats(values: np.ndarray, axis: tuple[int, ...]) -> dict[str, Any]:
    qs = np.quantile(values, [0.01, 0.10, 0.50, 0.90, 0.99], axis=axis)
    return {
        "min": np.min(values, axis=axis).tolist(),
        "max": np.max(values, axis=axis).tolist(),
        "mean": np.mean(values, axis=axis).tolist(),
        "std": np.std(values, axis=axis).tolist(),
        "count": [int(values.shape[0])],
        "q01": qs[0].tolist(),
        "q10": qs[1].tolist(),
        "q50": qs[2].tolist(),
        "q90": qs[3].tolist(),
        "q99": qs[4].tolist(),
    }


def _vector_feature(dim: int, names: list[str]) -> dict[str, Any]:
    return {"dtype": "float32", "shape": [dim], "names": names}


def _features(with_images: bool) -> dict[str, Any]:
    feats: dict[str, Any] = {
        "observation.state": _vector_feature(2, ["x", "y"]),
        "observation.environment_state": _vector_feature(2, ["target_x", "target_y"]),
        "action": _vector_feature(2, ["vx", "vy"]),
    }
    if with_images:
        feats["observation.images.top"] = {
            "dtype": "image",
            "shape": [IMAGE_SIZE, IMAGE_SIZE, 3],
            "names": ["height", "width", "channel"],
        }
    for name, dtype in (("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"), ("index", "int64"), ("task_index", "int64")):
        feats[name] = {"dtype": dtype, "shape": [1], "names": None}
    return feats


def demo_features(with_images: bool = False) -> dict[str, Any]:
    """The demo's `meta/info.json` features, without generating anything."""
    return _features(with_images)


def _episodes(num_episodes: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [_expert_episode(rng, int(rng.integers(40, 61))) for _ in range(num_episodes)]


def _data_table(episodes: list[dict[str, np.ndarray]], with_images: bool) -> tuple[pa.Table, dict[str, np.ndarray]]:
    cols: dict[str, list[Any]] = {k: [] for k in ("timestamp", "frame_index", "episode_index", "index", "task_index")}
    vectors: dict[str, list[np.ndarray]] = {k: [] for k in episodes[0]}
    images: list[dict[str, Any]] = []
    index = 0
    for ep_idx, ep in enumerate(episodes):
        length = len(ep["action"])
        for frame in range(length):
            cols["timestamp"].append(np.float32(frame / FPS))
            cols["frame_index"].append(frame)
            cols["episode_index"].append(ep_idx)
            cols["index"].append(index)
            cols["task_index"].append(0)
            index += 1
            if with_images:
                png = _render(ep["observation.state"][frame], ep["observation.environment_state"][frame])
                images.append({"bytes": png, "path": f"frame_{index - 1:06d}.png"})
        for key, value in ep.items():
            vectors[key].append(value)
    stacked = {k: np.concatenate(v) for k, v in vectors.items()}
    arrays: dict[str, pa.Array] = {}
    for key, value in stacked.items():
        arrays[key] = pa.FixedSizeListArray.from_arrays(pa.array(value.reshape(-1), pa.float32()), value.shape[1])
    if with_images:
        arrays["observation.images.top"] = pa.array(images, pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    arrays["timestamp"] = pa.array(cols["timestamp"], pa.float32())
    for key in ("frame_index", "episode_index", "index", "task_index"):
        arrays[key] = pa.array(cols[key], pa.int64())
    return pa.table(arrays), stacked


def _image_stats(table: pa.Table) -> dict[str, Any]:
    from PIL import Image

    pixels = np.stack([np.asarray(Image.open(io.BytesIO(cell["bytes"]))) for cell in table.column("observation.images.top").to_pylist()])
    chw = pixels.astype(np.float32).transpose(0, 3, 1, 2) / 255.0
    stats = _stats(chw, axis=(0, 2, 3))
    return {k: (np.asarray(v).reshape(-1, 1, 1).tolist() if k != "count" else v) for k, v in stats.items()}


def make_demo_dataset(root: Path, *, num_episodes: int = 40, seed: int = 0, with_images: bool = False) -> Path:
    """Write the demo dataset into `root` (which must not exist yet) and return it."""
    root = Path(root)
    episodes = _episodes(num_episodes, seed)
    table, stacked = _data_table(episodes, with_images)
    (root / "data" / "chunk-000").mkdir(parents=True)
    (root / "meta" / "episodes" / "chunk-000").mkdir(parents=True)
    pq.write_table(table, root / "data" / "chunk-000" / "file-000.parquet")
    stats = {key: _stats(value, axis=(0,)) for key, value in stacked.items()}
    if with_images:
        stats["observation.images.top"] = _image_stats(table)
    lengths = [len(ep["action"]) for ep in episodes]
    starts = np.cumsum([0] + lengths[:-1]).tolist()
    episodes_table = pa.table(
        {
            "episode_index": pa.array(list(range(num_episodes)), pa.int64()),
            "tasks": pa.array([["Reach the green target."]] * num_episodes, pa.list_(pa.string())),
            "length": pa.array(lengths, pa.int64()),
            "data/chunk_index": pa.array([0] * num_episodes, pa.int64()),
            "data/file_index": pa.array([0] * num_episodes, pa.int64()),
            "dataset_from_index": pa.array(starts, pa.int64()),
            "dataset_to_index": pa.array([s + n for s, n in zip(starts, lengths)], pa.int64()),
        }
    )
    pq.write_table(episodes_table, root / "meta" / "episodes" / "chunk-000" / "file-000.parquet")
    pq.write_table(
        pa.table({"task_index": pa.array([0], pa.int64()), "task": pa.array(["Reach the green target."])}),
        root / "meta" / "tasks.parquet",
    )
    info = {
        "codebase_version": "v3.0",
        "robot_type": "sim_point2d",
        "total_episodes": num_episodes,
        "total_frames": int(sum(lengths)),
        "total_tasks": 1,
        "chunks_size": 1000,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 500,
        "fps": FPS,
        "splits": {"train": f"0:{num_episodes}"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "features": _features(with_images),
    }
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=2) + "\n")
    (root / "meta" / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return root


def ensure_demo_dataset(repo_id: str) -> Path:
    """The demo dataset's folder in the cache, generated on first use (atomically)."""
    root = demo_root(repo_id)
    if (root / _MARKER).exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    try:
        make_demo_dataset(tmp / "ds")
        (tmp / "ds" / _MARKER).write_text(f"lr demo dataset v{DEMO_VERSION}\n")
        if root.exists():
            shutil.rmtree(root, ignore_errors=True)
        try:
            os.replace(tmp / "ds", root)
        except OSError:
            if not (root / _MARKER).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root
