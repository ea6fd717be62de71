"""Reading LeRobot v3 datasets from a local folder.

`resolve_dataset_root(cfg)` finds the folder: `--dataset.root`, else the demo (generated on
first use), else the local Hugging Face caches for `--dataset.repo_id` (no network):
`$HF_LEROBOT_HOME/<repo_id>` (default `~/.cache/huggingface/lerobot`) and the hub cache's
`datasets--<org>--<name>/snapshots/<main>`.

`LeRobotDataset(root, episodes, action_horizon)` loads the frames of the selected episodes
into memory (vectors as float32 arrays, images as PNG bytes decoded per item) and returns,
per frame, the observation plus the next `action_horizon` actions padded at the episode end
with `action_is_pad`. Video features are refused by name. Every problem is a
`DatasetError` that names the file or feature.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
from lr_config import DEMO_REPO_ID, DatasetConfig, FeatureSpec

from .demo import demo_features, demo_root, ensure_demo_dataset
from .errors import DatasetError

BOOKKEEPING = ("timestamp", "frame_index", "episode_index", "index", "task_index")


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

    def policy_features(self) -> tuple[dict[str, FeatureSpec], dict[str, FeatureSpec]]:
        """Inputs and outputs as the policy sees them (images as [C, H, W])."""
        inputs: dict[str, FeatureSpec] = {}
        outputs: dict[str, FeatureSpec] = {}
        for key, feat in self.features.items():
            if key in BOOKKEEPING:
                continue
            shape = [int(s) for s in feat["shape"]]
            if feat["dtype"] in ("image", "video"):
                inputs[key] = FeatureSpec(type="VISUAL", shape=[shape[2], shape[0], shape[1]])
            elif key == "action":
                outputs[key] = FeatureSpec(type="ACTION", shape=shape)
            elif key == "observation.environment_state":
                inputs[key] = FeatureSpec(type="ENV", shape=shape)
            elif key.startswith("observation.state"):
                inputs[key] = FeatureSpec(type="STATE", shape=shape)
        if "action" not in outputs:
            raise DatasetError(f"{self.root / 'meta' / 'info.json'}: the dataset has no 'action' feature to learn")
        if not inputs:
            raise DatasetError(f"{self.root / 'meta' / 'info.json'}: the dataset has no observation.* features")
        return inputs, outputs


def _hub_cache_snapshot(repo_id: str) -> Path | None:
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub")
    repo = hub / f"datasets--{repo_id.replace('/', '--')}"
    ref = repo / "refs" / "main"
    if ref.exists():
        snap = repo / "snapshots" / ref.read_text().strip()
        return snap if snap.exists() else None
    snaps = sorted((repo / "snapshots").glob("*")) if (repo / "snapshots").exists() else []
    return snaps[-1] if snaps else None


def resolve_dataset_root(cfg: DatasetConfig, *, create_demo: bool = True) -> Path:
    """The local folder of the dataset, or a DatasetError that says where it looked."""
    if cfg.root is not None:
        if not Path(cfg.root).exists():
            raise DatasetError(f"--dataset.root: {cfg.root} does not exist; pass the folder of a LeRobot v3 dataset")
        if not (Path(cfg.root) / "meta" / "info.json").exists():
            raise DatasetError(f"--dataset.root: {cfg.root} is not a LeRobot v3 dataset (no meta/info.json)")
        return Path(cfg.root)
    if cfg.repo_id == DEMO_REPO_ID:
        if not create_demo:
            return demo_root(cfg.repo_id)
        try:
            return ensure_demo_dataset(cfg.repo_id)
        except OSError as exc:
            raise DatasetError(
                f"the demo dataset cannot be generated in {demo_root(cfg.repo_id)} ({exc.strerror or exc}: {exc.filename}); "
                "set LR_CACHE_DIR to a writable folder, or pass --dataset.root=<a LeRobot v3 dataset>"
            ) from None
    lerobot_home = Path(os.environ.get("HF_LEROBOT_HOME") or Path.home() / ".cache" / "huggingface" / "lerobot")
    candidates = [lerobot_home / cfg.repo_id, _hub_cache_snapshot(cfg.repo_id)]
    for path in candidates:
        if path is not None and (path / "meta" / "info.json").exists():
            return path
    raise DatasetError(
        f"--dataset.repo_id: {cfg.repo_id!r} is not in the local caches (looked in {lerobot_home / cfg.repo_id} "
        "and the Hugging Face hub cache); lr never downloads at run time: download it first, or pass "
        f"--dataset.root=<folder>, or use the demo with --dataset.repo_id={DEMO_REPO_ID}"
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing; not a LeRobot v3 dataset") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise DatasetError(f"{path}: expected a JSON object")
    return data


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


def _episode_table(root: Path) -> dict[str, np.ndarray]:
    files = sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
    if not files:
        raise DatasetError(f"{root / 'meta' / 'episodes'}: no episode parquet files")
    cols = ("episode_index", "length", "data/chunk_index", "data/file_index", "dataset_from_index", "dataset_to_index")
    parts: dict[str, list[np.ndarray]] = {c: [] for c in cols}
    for f in files:
        table = pq.read_table(f, columns=list(cols))
        for c in cols:
            parts[c].append(table.column(c).to_numpy())
    return {c: np.concatenate(v) for c, v in parts.items()}


class LeRobotDataset(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Frames of a LeRobot v3 dataset with action windows (see the module docstring)."""

    def __init__(self, root: Path, *, episodes: list[int] | None = None, action_horizon: int = 1) -> None:
        self.meta = load_meta(Path(root))
        self.action_horizon = action_horizon
        self._check_features()
        ep = _episode_table(self.meta.root)
        selected = np.arange(len(ep["episode_index"])) if episodes is None else self._select(ep, episodes)
        self.episode_ids = ep["episode_index"][selected]
        self._columns = self._load_frames(ep, selected)
        self._ep_end = self._episode_ends()

    def _check_features(self) -> None:
        for key, feat in self.meta.features.items():
            if feat.get("dtype") == "video":
                raise DatasetError(
                    f"{self.meta.root / 'meta' / 'info.json'}: feature {key!r} is stored as video, which lr does "
                    "not decode yet; re-export the dataset with images (use_videos=False)"
                )

    def _select(self, ep: dict[str, np.ndarray], episodes: list[int]) -> np.ndarray:
        index = {int(e): i for i, e in enumerate(ep["episode_index"])}
        missing = [e for e in episodes if e not in index]
        if missing:
            raise DatasetError(f"--dataset.episodes: episodes {missing} are not in the dataset (it has {len(index)})")
        return np.asarray([index[e] for e in episodes], dtype=np.int64)

    def _load_frames(self, ep: dict[str, np.ndarray], selected: np.ndarray) -> dict[str, Any]:
        wanted = [k for k in self.meta.features]
        tables: dict[tuple[int, int], Any] = {}
        pieces: dict[str, list[Any]] = {k: [] for k in wanted}
        for i in selected:
            key = (int(ep["data/chunk_index"][i]), int(ep["data/file_index"][i]))
            if key not in tables:
                tables[key] = self._read_data_file(*key)
            table = tables[key]
            start, stop = int(ep["dataset_from_index"][i]), int(ep["dataset_to_index"][i])
            index = table["index"]
            rows = np.nonzero((index >= start) & (index < stop))[0]
            if len(rows) != stop - start:
                raise DatasetError(f"{self._data_path(*key)}: episode {int(ep['episode_index'][i])} is incomplete ({len(rows)} of {stop - start} frames)")
            for k in wanted:
                col = table[k]
                pieces[k].append(col[rows] if isinstance(col, np.ndarray) else [col[r] for r in rows])
        return {k: (np.concatenate(v) if v and isinstance(v[0], np.ndarray) else [x for part in v for x in part]) for k, v in pieces.items()}

    def _data_path(self, chunk: int, file: int) -> Path:
        return self.meta.root / str(self.meta.info["data_path"]).format(chunk_index=chunk, file_index=file)

    def _read_data_file(self, chunk: int, file: int) -> dict[str, Any]:
        path = self._data_path(chunk, file)
        if not path.exists():
            raise DatasetError(f"{path}: data file missing (listed in meta/episodes)")
        try:
            table = pq.read_table(path)
        except Exception as exc:  # pyarrow raises many types for corrupt files
            raise DatasetError(f"{path}: cannot read parquet ({exc})") from None
        out: dict[str, Any] = {}
        for key, feat in self.meta.features.items():
            if key not in table.column_names:
                raise DatasetError(f"{path}: feature {key!r} from meta/info.json is missing in the data file")
            col = table.column(key)
            if feat["dtype"] == "image":
                out[key] = [cell["bytes"] for cell in col.to_pylist()]
            elif len(feat["shape"]) == 1 and feat["shape"][0] >= 1 and key not in BOOKKEEPING:
                flat = col.combine_chunks()
                values = flat.flatten().to_numpy(zero_copy_only=False) if hasattr(flat, "flatten") else flat.to_numpy()
                out[key] = np.asarray(values, dtype=np.float32).reshape(len(col), -1)
                if out[key].shape[1] != feat["shape"][0]:
                    raise DatasetError(
                        f"{path}: feature {key!r} has {out[key].shape[1]} values per frame, but meta/info.json "
                        f"declares shape {feat['shape']}; fix the shape in meta/info.json or re-export the dataset"
                    )
            else:
                out[key] = col.to_numpy()
        return out

    def _episode_ends(self) -> np.ndarray:
        """For each frame, the index (in this dataset) one past its episode's last frame."""
        ep = np.asarray(self._columns["episode_index"])
        ends = np.empty(len(ep), dtype=np.int64)
        boundaries = np.nonzero(np.diff(ep))[0] + 1
        starts = np.concatenate([[0], boundaries])
        stops = np.concatenate([boundaries, [len(ep)]])
        for s, e in zip(starts, stops):
            ends[s:e] = e
        return ends

    def __len__(self) -> int:
        return len(self._ep_end)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        item: dict[str, torch.Tensor] = {}
        for key, feat in self.meta.features.items():
            if key in BOOKKEEPING or key == "action":
                continue
            if feat["dtype"] == "image":
                item[key] = _decode_image(self._columns[key][idx])
            elif key.startswith("observation."):
                item[key] = torch.from_numpy(self._columns[key][idx].copy())
        end = int(self._ep_end[idx])
        window = np.arange(idx, idx + self.action_horizon)
        pad = window >= end
        window = np.minimum(window, end - 1)
        item["action"] = torch.from_numpy(self._columns["action"][window].copy())
        item["action_is_pad"] = torch.from_numpy(pad)
        item["index"] = torch.tensor(int(self._columns["index"][idx]))
        item["episode_index"] = torch.tensor(int(self._columns["episode_index"][idx]))
        return item


def _decode_image(png: bytes) -> torch.Tensor:
    from PIL import Image

    arr = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.uint8)
    return torch.from_numpy(arr.transpose(2, 0, 1).copy()).float().div_(255.0)
