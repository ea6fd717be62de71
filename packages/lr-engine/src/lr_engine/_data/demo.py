"""The embedded demo dataset: a simulated 2-D reaching task with a scripted expert.

A point agent starts at a random position and moves toward a random target; the expert
action is the velocity command `clip(gain * (target - agent), -max_speed, max_speed)`.
Observations: `observation.state` (agent x, y), `observation.environment_state` (target
x, y) and, optionally, `observation.images.top` (a 32x32 RGB rendering; other sizes and more
cameras on request). Action: (vx, vy).

The shipped demo (`ensure_demo_dataset`) records what a person recording with LeRobot would:
each of its `DEMO_EPISODES` episodes ends `DEMO_FRAMES_AFTER_REACH` frames after the agent came
within `REACHED` of its target (the eval's success radius), so its frames mostly show the
reaching, not the agent sitting on the target. (Measured: with episodes that went on for 40-60
frames, about 85% of them waiting at the target, the zero-flag ACT learned to stand still: 3-4%
success at 300 steps, random actions 5%; with this recording it reaches 66-78%:
BENCHMARKS.md, section 10.) `make_demo_dataset` without `frames_after_reach` writes the
full-length episodes the tests use.

`make_demo_dataset(root, ...)` writes it deterministically in LeRobot v3's layout (as
LeRobot 0.6's writer lays it out, images stored as PNG bytes in the data file, or with
`video=True` as one AV1 MP4 per camera holding all episodes one after the other, under
`videos/<key>/chunk-000/file-000.mp4`, with the episodes' `videos/<key>/*` columns and stats
computed from the decoded frames). `ensure_demo_dataset()`
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from lr_config.datasets import demo_root

DEMO_VERSION = 2
"""2: the shipped demo's episodes end soon after the target is reached (version 1 recorded 40 episodes of 40-60 frames)."""
DEMO_EPISODES = 200
DEMO_FRAMES_AFTER_REACH = 5
REACHED = 0.05
FPS = 10
IMAGE_SIZE = 32
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
VIDEO_G = 2  # LeRobot's defaults: a keyframe every 2 frames, crf 30
VIDEO_CRF = 30
_MARKER = f".lr_demo_v{DEMO_VERSION}"


MAX_SPEED = 0.6
"""The largest velocity command on each axis (the expert's, and the action space's bound)."""


def start_positions(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """An episode's (agent, target) start, drawn in that order, each uniform in [-1, 1]^2."""
    agent = rng.uniform(-1.0, 1.0, size=2)
    target = rng.uniform(-1.0, 1.0, size=2)
    return agent, target


def expert_action(agent: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The scripted expert's velocity command (works on [..., 2] arrays)."""
    return np.clip(1.5 * (target - agent), -MAX_SPEED, MAX_SPEED)


def move(agent: np.ndarray, action: np.ndarray) -> np.ndarray:
    """The task's dynamics: where the agent is one frame after the velocity command `action`."""
    return np.clip(agent + np.clip(action, -MAX_SPEED, MAX_SPEED) / FPS * 3.0, -1.0, 1.0)


def _expert_episode(rng: np.random.Generator, length: int) -> dict[str, np.ndarray]:
    agent, target = start_positions(rng)
    states, actions = [], []
    for _ in range(length):
        action = expert_action(agent, target)
        states.append(agent.copy())
        actions.append(action)
        agent = move(agent, action)
    env = np.repeat(target[None, :], length, axis=0)
    return {
        "observation.state": np.asarray(states, dtype=np.float32),
        "observation.environment_state": env.astype(np.float32),
        "action": np.asarray(actions, dtype=np.float32),
    }


@dataclass(frozen=True)
class Cameras:
    """The image features to write: camera names, frame size, and PNG or video storage."""

    names: tuple[str, ...] = ()
    height: int = IMAGE_SIZE
    width: int = IMAGE_SIZE
    video: bool = False

    def keys(self) -> list[str]:
        return [f"observation.images.{name}" for name in self.names]


def render(state: np.ndarray, target: np.ndarray, cams: Cameras, camera: int) -> np.ndarray:
    """The scene as camera `camera` sees it: later cameras look mirrored, on a lighter floor."""
    img = np.full((cams.height, cams.width, 3), 24 + 40 * (camera % 5), dtype=np.uint8)
    size = np.array([cams.width - 1, cams.height - 1])

    def dot(pos: np.ndarray, color: tuple[int, int, int]) -> None:
        cx, cy = ((pos + 1.0) / 2.0 * size).round().astype(int)
        img[max(cy - 1, 0) : cy + 2, max(cx - 1, 0) : cx + 2] = color

    dot(target, (40, 220, 60))
    dot(state, (230, 50, 40))
    return img[:, ::-1].copy() if camera % 2 else img


def _png(img: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()


def _camera_frames(episodes: list[dict[str, np.ndarray]], cams: Cameras, camera: int) -> np.ndarray:
    """uint8 (frames, H, W, 3) of one camera over all episodes, in dataset order."""
    return np.stack(
        [
            render(state, target, cams, camera)
            for ep in episodes
            for state, target in zip(ep["observation.state"], ep["observation.environment_state"])
        ]
    )


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


def _video_info(cams: Cameras) -> dict[str, Any]:
    """A video feature's `info` block, as LeRobot 0.6.1 writes it for its default encoder."""
    from .video import SVTAV1_PRESET

    return {
        "video.height": cams.height,
        "video.width": cams.width,
        "video.codec": "av1",
        "video.pix_fmt": "yuv420p",
        "video.fps": FPS,
        "video.channels": 3,
        "has_audio": False,
        "video.g": VIDEO_G,
        "video.crf": VIDEO_CRF,
        "video.preset": SVTAV1_PRESET,
        "video.fast_decode": 0,
        "video.video_backend": "pyav",
        "video.extra_options": {},
        "is_depth_map": False,
    }


def _image_feature(cams: Cameras) -> dict[str, Any]:
    feat: dict[str, Any] = {
        "dtype": "video" if cams.video else "image",
        "shape": [cams.height, cams.width, 3],
        "names": ["height", "width", "channel"],
    }
    if cams.video:
        feat["info"] = _video_info(cams)
    return feat


def _features(cams: Cameras) -> dict[str, Any]:
    feats: dict[str, Any] = {
        "observation.state": _vector_feature(2, ["x", "y"]),
        "observation.environment_state": _vector_feature(2, ["target_x", "target_y"]),
        "action": _vector_feature(2, ["vx", "vy"]),
    }
    for key in cams.keys():
        feats[key] = _image_feature(cams)
    for name, dtype in (("timestamp", "float32"), ("frame_index", "int64"), ("episode_index", "int64"), ("index", "int64"), ("task_index", "int64")):
        feats[name] = {"dtype": dtype, "shape": [1], "names": None}
    return feats


def _cameras(with_images: bool, video: bool, cameras: tuple[str, ...], image_height: int, image_width: int) -> Cameras:
    if video and not with_images:
        raise ValueError("video=True stores the camera images as video: pass with_images=True too")
    if with_images and (not cameras or len(set(cameras)) != len(cameras)):
        raise ValueError(f"cameras={cameras!r}: with_images=True needs one or more distinct camera names")
    if image_height < 8 or image_width < 8:
        raise ValueError(f"image size {image_height}x{image_width}: both sides must be at least 8 pixels")
    names = tuple(cameras) if with_images else ()
    return Cameras(names=names, height=image_height, width=image_width, video=video)


def demo_features(
    with_images: bool = False,
    *,
    video: bool = False,
    cameras: tuple[str, ...] = ("top",),
    image_height: int = IMAGE_SIZE,
    image_width: int = IMAGE_SIZE,
) -> dict[str, Any]:
    """The demo's `meta/info.json` features, without generating anything."""
    return _features(_cameras(with_images, video, cameras, image_height, image_width))


def _episodes(num_episodes: int, seed: int, frames_after_reach: int | None) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    episodes = [_expert_episode(rng, int(rng.integers(40, 61))) for _ in range(num_episodes)]
    if frames_after_reach is None:
        return episodes
    return [_until_reached(ep, frames_after_reach) for ep in episodes]


def _until_reached(episode: dict[str, np.ndarray], frames_after_reach: int) -> dict[str, np.ndarray]:
    """The episode cut `frames_after_reach` frames after its first frame within REACHED of the target."""
    distance = np.linalg.norm(episode["observation.state"] - episode["observation.environment_state"], axis=1)
    within = np.flatnonzero(distance < REACHED)
    end = len(distance) if len(within) == 0 else min(len(distance), int(within[0]) + frames_after_reach)
    return {key: value[:end] for key, value in episode.items()}


def _png_column(frames: np.ndarray) -> pa.Array[Any]:
    cells = [{"bytes": _png(img), "path": f"frame_{i:06d}.png"} for i, img in enumerate(frames)]
    return pa.array(cells, pa.struct([("bytes", pa.binary()), ("path", pa.string())]))


def _data_table(episodes: list[dict[str, np.ndarray]], png_images: dict[str, np.ndarray]) -> tuple[pa.Table, dict[str, np.ndarray]]:
    cols: dict[str, list[Any]] = {k: [] for k in ("timestamp", "frame_index", "episode_index", "index", "task_index")}
    vectors: dict[str, list[np.ndarray]] = {k: [] for k in episodes[0]}
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
        for key, value in ep.items():
            vectors[key].append(value)
    stacked = {k: np.concatenate(v) for k, v in vectors.items()}
    arrays: dict[str, pa.Array[Any]] = {}
    for key, value in stacked.items():
        arrays[key] = pa.FixedSizeListArray.from_arrays(pa.array(value.reshape(-1), pa.float32()), value.shape[1])
    for key, frames in png_images.items():
        arrays[key] = _png_column(frames)
    arrays["timestamp"] = pa.array(cols["timestamp"], pa.float32())
    for key in ("frame_index", "episode_index", "index", "task_index"):
        arrays[key] = pa.array(cols[key], pa.int64())
    return pa.table(arrays), stacked


def _image_stats(pixels: np.ndarray) -> dict[str, Any]:
    """Per-channel stats of uint8 (N, H, W, 3) frames, shaped (3, 1, 1) as LeRobot's."""
    chw = pixels.astype(np.float32).transpose(0, 3, 1, 2) / 255.0
    stats = _stats(chw, axis=(0, 2, 3))
    return {k: (np.asarray(v).reshape(-1, 1, 1).tolist() if k != "count" else v) for k, v in stats.items()}


def _write_videos(root: Path, frames: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Encode each camera's frames into its LeRobot video file; return the decoded frames."""
    from .video import decode_all, encode_video

    decoded = {}
    for key, pixels in frames.items():
        path = root / VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=0)
        encode_video(pixels, path, FPS, codec="av1", g=VIDEO_G, crf=VIDEO_CRF)
        decoded[key] = decode_all(path)
    return decoded


def _video_columns(keys: list[str], lengths: list[int]) -> dict[str, pa.Array[Any]]:
    """Where each episode lies in each camera's video file (all episodes in file 0, in order)."""
    ends = np.cumsum(lengths)
    starts = ends - np.asarray(lengths)
    cols: dict[str, pa.Array[Any]] = {}
    for key in keys:
        cols[f"videos/{key}/chunk_index"] = pa.array([0] * len(lengths), pa.int64())
        cols[f"videos/{key}/file_index"] = pa.array([0] * len(lengths), pa.int64())
        cols[f"videos/{key}/from_timestamp"] = pa.array((starts / FPS).tolist(), pa.float64())
        cols[f"videos/{key}/to_timestamp"] = pa.array((ends / FPS).tolist(), pa.float64())
    return cols


def make_demo_dataset(
    root: Path,
    *,
    num_episodes: int = 40,
    seed: int = 0,
    with_images: bool = False,
    video: bool = False,
    cameras: tuple[str, ...] = ("top",),
    image_height: int = IMAGE_SIZE,
    image_width: int = IMAGE_SIZE,
    frames_after_reach: int | None = None,
) -> Path:
    """Write the demo dataset into `root` (which must not exist yet) and return it.

    `with_images` adds one image feature per name in `cameras` (`observation.images.<name>`,
    `image_height` x `image_width`), stored as PNG in the data file, or as AV1 video with `video`.
    `frames_after_reach` ends each episode that many frames after the agent reached its target
    (the shipped demo's recording); None keeps the full 40-60 frames.
    """
    root = Path(root)
    cams = _cameras(with_images, video, cameras, image_height, image_width)
    episodes = _episodes(num_episodes, seed, frames_after_reach)
    pixels = {key: _camera_frames(episodes, cams, i) for i, key in enumerate(cams.keys())}
    table, stacked = _data_table(episodes, {} if cams.video else pixels)
    (root / "data" / "chunk-000").mkdir(parents=True)
    (root / "meta" / "episodes" / "chunk-000").mkdir(parents=True)
    pq.write_table(table, root / "data" / "chunk-000" / "file-000.parquet")
    stats = {key: _stats(value, axis=(0,)) for key, value in stacked.items()}
    # A video feature's stats describe what a loader decodes, not what went into the encoder.
    seen = _write_videos(root, pixels) if cams.video else pixels
    for key, frames in seen.items():
        stats[key] = _image_stats(frames)
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
            **(_video_columns(cams.keys(), lengths) if cams.video else {}),
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
        "video_path": VIDEO_PATH,
        "features": _features(cams),
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
        make_demo_dataset(tmp / "ds", num_episodes=DEMO_EPISODES, frames_after_reach=DEMO_FRAMES_AFTER_REACH)
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
