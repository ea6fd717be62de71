"""Reading LeRobot v3 datasets: tables, images and videos, without holding the data in memory.

`LeRobotDataset(root, episodes=..., action_horizon=..., video_backend=..., tolerance_s=...,
image_transforms=..., seed=...)` returns, per frame of the selected episodes, the
observation (vectors, images, video frames) plus the next `action_horizon` actions, padded at
the episode's end with `action_is_pad`. Its memory does not grow with the dataset:

- the data files are read through memory-mapped Arrow copies (`arrow.py`), row by row;
- the index is per episode (a frame is found by a binary search of the episodes' lengths);
- images (PNG bytes) and video frames are decoded per item, videos by timestamp as LeRobot
  does (`video.py`: the episode's start in the file plus the frame's timestamp, matched
  within `tolerance_s`), by one decoder per process that keeps its files open.

Checks at construction (so a run refuses bad data before it writes anything): the features
of meta/info.json against every data file (present, vector widths), each episode's frames
complete, each video file present, decodable, of the declared size and long enough for the
last frame its episodes need. Every problem is a `DatasetError` naming the file, the episode
and the feature.

An item is asked for by its index, or by `(index, sample)` where `sample` is its number in the
run's global sample order: with `image_transforms` enabled, the sample number and the seed
seed its augmentation (`transforms.py`), so every rank and worker and a resumed run augment
a sample alike. Where the folder comes from (local, demo, Hub): `locate.py`.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from lr_config import ConfigError, FeatureSpec, ImageTransformsConfig, read_json_object
from lr_config.datasets import BOOKKEEPING, policy_features

from .arrow import MappedColumns, mapped_table
from .demo import demo_features, demo_root
from .errors import DatasetError

__all__ = ["BOOKKEEPING", "DatasetError", "DatasetMeta", "LeRobotDataset", "data_files", "load_meta"]



@dataclass
class DatasetMeta:
    root: Path
    info: dict[str, Any]
    stats: dict[str, dict[str, Any]]

    @property
    def fps(self) -> int:
        return int(self.info["fps"])

    @property
    def features(self) -> dict[str, dict[str, Any]]:
        return dict(self.info["features"])

    @property
    def video_keys(self) -> list[str]:
        return [key for key, feat in self.features.items() if feat.get("dtype") == "video"]

    def policy_features(self) -> tuple[dict[str, FeatureSpec], dict[str, FeatureSpec]]:
        """Inputs and outputs as the policy sees them (images as [C, H, W]): lr_config.datasets' rule."""
        try:
            found = policy_features(self.info, str(self.root / "meta" / "info.json"))
        except ConfigError as exc:
            raise DatasetError(str(exc)) from None
        return found.inputs, found.outputs

def _read_json(path: Path) -> dict[str, Any]:
    return read_json_object(path, error=DatasetError, missing=": missing; not a LeRobot v3 dataset")


def load_meta(root: Path) -> DatasetMeta:
    info = _read_json(root / "meta" / "info.json")
    for key in ("fps", "features", "data_path"):
        if key not in info:
            raise DatasetError(f"{root / 'meta' / 'info.json'}: missing {key!r}")
    version = str(info.get("codebase_version", ""))
    if not version.startswith("v3"):
        raise DatasetError(f"{root / 'meta' / 'info.json'}: codebase_version {version!r} is not supported; lr reads LeRobot v3 datasets")
    stats_path = root / "meta" / "stats.json"
    stats = _read_json(stats_path) if stats_path.exists() else {}
    return DatasetMeta(root=root, info=info, stats=stats)


def demo_meta_without_files(repo_id: str) -> DatasetMeta:
    """Meta of the demo for planning (dry runs) when it was not generated yet."""
    return DatasetMeta(root=demo_root(repo_id), info={"fps": 10, "features": demo_features(), "data_path": ""}, stats={})



_EPISODE_COLUMNS = ("episode_index", "length", "data/chunk_index", "data/file_index", "dataset_from_index", "dataset_to_index")


def _episode_table(meta: DatasetMeta) -> dict[str, np.ndarray]:
    """meta/episodes as columns: the bookkeeping, and each video feature's file and start time."""
    root = meta.root
    files = sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    if not files:
        raise DatasetError(f"{root / 'meta' / 'episodes'}: no episode parquet files")
    video_cols = [f"videos/{key}/{part}" for key in meta.video_keys for part in ("chunk_index", "file_index", "from_timestamp")]
    parts: dict[str, list[np.ndarray]] = {c: [] for c in (*_EPISODE_COLUMNS, *video_cols)}
    for f in files:
        try:
            names = pq.read_schema(f).names
            missing = [c for c in parts if c not in names]
            if missing:
                raise DatasetError(f"{f}: the episodes table has no column(s) {missing}; the dataset's meta is incomplete")
            table = pq.read_table(f, columns=list(parts))
        except DatasetError:
            raise
        except Exception as exc:  # pyarrow raises many types for corrupt files
            raise DatasetError(f"{f}: cannot read the episodes table ({exc})") from None
        for c in parts:
            parts[c].append(table.column(c).to_numpy())
    return {c: np.concatenate(v) for c, v in parts.items()}


def _selection(ep: dict[str, np.ndarray], episodes: list[int] | None) -> np.ndarray:
    if episodes is None:
        return np.arange(len(ep["episode_index"]))
    index = {int(e): i for i, e in enumerate(ep["episode_index"])}
    missing = [e for e in episodes if e not in index]
    if missing:
        raise DatasetError(f"--dataset.episodes: episodes {missing} are not in the dataset (it has {len(index)})")
    return np.asarray([index[e] for e in episodes], dtype=np.int64)


def _episode_row(path: Path, index: np.ndarray, start: int, length: int, episode: int) -> int:
    """The episode's first row in its data file (its frames hold `index` start .. start+length-1)."""
    if len(index) and int(index[-1]) - int(index[0]) == len(index) - 1 and (np.diff(index) == 1).all():
        row = start - int(index[0])
        found = max(0, min(row + length, len(index)) - max(row, 0))
    else:
        hits = np.nonzero((index >= start) & (index < start + length))[0]
        row, found = (int(hits[0]) if len(hits) else -1), len(hits)
        if found and int(hits[-1]) - row != found - 1:
            found = 0  # its frames are not one block of rows
    if found != length:
        raise DatasetError(f"{path}: episode {episode} is incomplete ({found} of {length} frames)")
    return row


def _data_path(meta: DatasetMeta, chunk: int, file: int) -> Path:
    return meta.root / str(meta.info["data_path"]).format(chunk_index=chunk, file_index=file)


def data_files(root: Path, episodes: list[int] | None = None) -> list[Path]:
    """The data files (parquet) that hold the episodes (None: all)."""
    meta = load_meta(root)
    ep = _episode_table(meta)
    chosen = _selection(ep, episodes)
    pairs = dict.fromkeys(zip(ep["data/chunk_index"][chosen].tolist(), ep["data/file_index"][chosen].tolist()))
    return [_data_path(meta, int(chunk), int(file)) for chunk, file in pairs]


@dataclass
class _Episodes:
    """The selected episodes, per episode only (memory grows with episodes, not frames)."""

    ids: np.ndarray  # episode_index
    starts: np.ndarray  # first dataset position of each episode; starts[-1] == total frames
    files: np.ndarray  # index into the dataset's data files
    rows: np.ndarray  # the episode's first row in its data file
    first_ts: np.ndarray  # the timestamps of its first and last frames
    last_ts: np.ndarray
    video_start: dict[str, np.ndarray]  # feature -> the episode's start time in its video file
    video_path: dict[str, list[Path]]  # feature -> the episode's video file


def _scan_data_file(path: Path, meta: DatasetMeta) -> tuple[np.ndarray, np.ndarray]:
    """The file's `index` and `timestamp` columns, after checking its columns against
    meta/info.json; reads the parquet file directly, so a bad file is refused before lr
    converts (writes) anything."""
    if not path.exists():
        raise DatasetError(f"{path}: data file missing (listed in meta/episodes)")
    try:
        schema = pq.read_schema(path)
    except Exception as exc:  # pyarrow raises many types for corrupt files
        raise DatasetError(f"{path}: cannot read parquet ({exc})") from None
    for key, feat in meta.features.items():
        if feat.get("dtype") == "video":
            continue
        if key not in schema.names:
            raise DatasetError(f"{path}: feature {key!r} from meta/info.json is missing in the data file")
        kind = schema.field(key).type
        shape = feat.get("shape") or []
        if pa.types.is_fixed_size_list(kind) and len(shape) == 1 and kind.list_size != int(shape[0]):
            raise DatasetError(
                f"{path}: feature {key!r} has {kind.list_size} values per frame, but meta/info.json "
                f"declares shape {shape}; fix the shape in meta/info.json or re-export the dataset"
            )
    try:
        table = pq.read_table(path, columns=["index", "timestamp"])
    except Exception as exc:
        raise DatasetError(f"{path}: cannot read parquet ({exc})") from None
    return table.column("index").to_numpy(), table.column("timestamp").to_numpy().astype(np.float64)


class LeRobotDataset(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Frames of a LeRobot v3 dataset with action windows (see the module docstring)."""

    def __init__(
        self,
        root: Path,
        *,
        episodes: list[int] | None = None,
        action_horizon: int = 1,
        video_backend: str = "pyav",
        tolerance_s: float = 1e-4,
        image_transforms: ImageTransformsConfig | None = None,
        seed: int = 0,
    ) -> None:
        from .transforms import ImageTransforms
        from .video import VideoDecoder

        self.meta = load_meta(Path(root))
        self.action_horizon = action_horizon
        self.seed = seed
        self.decoder = VideoDecoder(video_backend, tolerance_s=tolerance_s) if self.meta.video_keys else None
        self.transforms = ImageTransforms(image_transforms) if image_transforms is not None else None
        ep = _episode_table(self.meta)
        chosen = _selection(ep, episodes)
        self.episode_ids = ep["episode_index"][chosen]
        pairs = list(zip(ep["data/chunk_index"][chosen].tolist(), ep["data/file_index"][chosen].tolist()))
        self._paths = [_data_path(self.meta, int(c), int(f)) for c, f in dict.fromkeys(pairs)]
        self._mapped: list[MappedColumns] | None = None
        self._mapped_pid = os.getpid()
        self._episodes = self._index(ep, chosen, pairs)
        self._check_videos()

    def map_files(self) -> None:
        """Convert the data files to mapped Arrow now (one process per node calls it first; see arrow.py)."""
        for path in self._paths:
            mapped_table(path)

    # -- construction and checks -------------------------------------------------------------

    def _columns_of(self, file: int) -> MappedColumns:
        if self._mapped is None or os.getpid() != self._mapped_pid:
            self._mapped = [MappedColumns(mapped_table(path)) for path in self._paths]
            self._mapped_pid = os.getpid()
        return self._mapped[file]

    def _index(self, ep: dict[str, np.ndarray], chosen: np.ndarray, pairs: list[tuple[int, int]]) -> _Episodes:
        file_of = {pair: i for i, pair in enumerate(dict.fromkeys(pairs))}
        files = np.asarray([file_of[pair] for pair in pairs], dtype=np.int64)
        lengths = (ep["dataset_to_index"][chosen] - ep["dataset_from_index"][chosen]).astype(np.int64)
        rows = np.empty(len(chosen), dtype=np.int64)
        first_ts, last_ts = np.empty(len(chosen)), np.empty(len(chosen))
        for f, path in enumerate(self._paths):
            index, stamps = _scan_data_file(path, self.meta)
            for k in np.nonzero(files == f)[0]:
                i = chosen[k]
                row = _episode_row(path, index, int(ep["dataset_from_index"][i]), int(lengths[k]), int(ep["episode_index"][i]))
                rows[k], first_ts[k], last_ts[k] = row, stamps[row], stamps[row + int(lengths[k]) - 1]
        starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        video_start = {key: ep[f"videos/{key}/from_timestamp"][chosen].astype(np.float64) for key in self.meta.video_keys}
        video_path = {key: [self._video_path(key, int(ep[f"videos/{key}/chunk_index"][i]), int(ep[f"videos/{key}/file_index"][i]))
                            for i in chosen] for key in self.meta.video_keys}
        return _Episodes(ids=self.episode_ids, starts=starts, files=files, rows=rows, first_ts=first_ts, last_ts=last_ts,
                         video_start=video_start, video_path=video_path)

    def _video_path(self, key: str, chunk: int, file: int) -> Path:
        template = self.meta.info.get("video_path")
        if not isinstance(template, str):
            raise DatasetError(f"{self.meta.root / 'meta' / 'info.json'}: feature {key!r} is a video, but there is no 'video_path'")
        return self.meta.root / template.format(video_key=key, chunk_index=chunk, file_index=file)

    def _check_videos(self) -> None:
        """Each video file: present, decodable at the first and last frames its episodes need, of the declared size."""
        eps = self._episodes
        for key in self.meta.video_keys:
            assert self.decoder is not None
            ends: dict[Path, list[tuple[float, int]]] = {}
            for k, path in enumerate(eps.video_path[key]):
                start, episode = float(eps.video_start[key][k]), int(eps.ids[k])
                ends.setdefault(path, []).extend([(start + float(eps.first_ts[k]), episode), (start + float(eps.last_ts[k]), episode)])
            for path, times in ends.items():
                (first, first_ep), (last, last_ep) = min(times), max(times)
                frame = self.decoder.frames(path, [first], key=key, episode=first_ep)
                self._check_size(key, path, frame, first_ep)
                self.decoder.frames(path, [last], key=key, episode=last_ep)
        if self.decoder is not None:
            self.decoder.close()  # each DataLoader worker opens its own

    def _check_size(self, key: str, path: Path, frame: torch.Tensor, episode: int) -> None:
        h, w, c = (int(s) for s in self.meta.features[key]["shape"])
        got = tuple(frame.shape[1:])
        if got != (c, h, w):
            raise DatasetError(
                f"{path}: episode {episode}, feature {key!r}: frames are {got[1]}x{got[2]}x{got[0]} (HxWxC), but meta/info.json "
                f"declares shape {[h, w, c]}; fix meta/info.json or re-encode the video"
            )

    # -- items ---------------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_mapped"] = None  # maps are per process: reopened on first use
        return state

    def __len__(self) -> int:
        return int(self._episodes.starts[-1])

    def _locate(self, idx: int) -> tuple[int, int, int]:
        """(selected episode, file, row) of dataset position `idx`."""
        if not 0 <= idx < len(self):
            raise IndexError(f"frame {idx} of a dataset of {len(self)}")
        k = int(np.searchsorted(self._episodes.starts, idx, side="right")) - 1
        return k, int(self._episodes.files[k]), int(self._episodes.rows[k] + idx - self._episodes.starts[k])

    def __getitem__(self, key: int | tuple[int, int]) -> dict[str, torch.Tensor]:
        idx, sample = (key if isinstance(key, tuple) else (key, None))
        k, file, row = self._locate(int(idx))
        columns = self._columns_of(file)
        gen = None
        if sample is not None and self.transforms is not None and self.transforms.enabled:
            from .transforms import sample_generator

            gen = sample_generator(self.seed, int(sample))
        item: dict[str, torch.Tensor] = {}
        for name, feat in self.meta.features.items():
            if name in BOOKKEEPING or name == "action":
                continue
            if feat["dtype"] == "video":
                item[name] = self._video_frame(name, k, columns, row)
            elif feat["dtype"] == "image":
                item[name] = _decode_image(columns.cell_bytes(name, row))
            elif name.startswith("observation."):
                item[name] = torch.from_numpy(columns.values(name, np.asarray([row]))[0].astype(np.float32, copy=False))
            if gen is not None and feat["dtype"] in ("image", "video"):
                item[name] = self.transforms(item[name], gen)  # type: ignore[misc]
        end = int(self._episodes.rows[k] + self._episodes.starts[k + 1] - self._episodes.starts[k])
        window = np.arange(row, row + self.action_horizon)
        pad = window >= end
        item["action"] = torch.from_numpy(columns.values("action", np.minimum(window, end - 1)).astype(np.float32, copy=False))
        item["action_is_pad"] = torch.from_numpy(pad)
        item["index"] = torch.tensor(int(columns.values("index", np.asarray([row]))[0]))
        item["episode_index"] = torch.tensor(int(self._episodes.ids[k]))
        return item

    def _video_frame(self, key: str, k: int, columns: MappedColumns, row: int) -> torch.Tensor:
        assert self.decoder is not None
        when = float(self._episodes.video_start[key][k]) + float(columns.values("timestamp", np.asarray([row]))[0])
        return self.decoder.frames(self._episodes.video_path[key][k], [when], key=key, episode=int(self._episodes.ids[k]))[0]


def _decode_image(png: bytes) -> torch.Tensor:
    from PIL import Image

    arr = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.uint8)
    return torch.from_numpy(arr.transpose(2, 0, 1).copy()).float().div_(255.0)
