"""Where a dataset's files are and what a policy takes from it, without torch or the network.

lr-engine reads datasets from these places (in this order, `resolve_dataset_root`), and lr-tui
shows where a dataset is and what it holds before a run starts; both use these functions:

- `--dataset.root`: a local LeRobot v3 folder;
- the embedded demo (`lr/demo_reach2d`): `<lr cache>/datasets/<repo_id>`, generated on first use
  (`lr_cache_dir()`: `$LR_CACHE_DIR`, else `$XDG_CACHE_HOME/lr`, else `~/.cache/lr`);
- a copy LeRobot itself downloaded: `$HF_LEROBOT_HOME/<repo_id>` (default
  `~/.cache/huggingface/lerobot`);
- the Hugging Face hub cache (`hub_cache_dir()`: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
  `~/.cache/huggingface/hub`), `datasets--<org>--<name>/snapshots/<commit>/`.

`policy_features(info, where)` is the one rule that turns `meta/info.json`'s features into a
policy's inputs and outputs: images and videos are `VISUAL` ([C, H, W]), `observation.state*`
is `STATE`, `observation.environment_state` is `ENV`, `action` is `ACTION`; any other feature is
not given to the policy (`ignored`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ._configs import DEMO_REPO_ID, FeatureSpec
from ._errors import ConfigError
from ._serde import read_json_object

__all__ = [
    "BOOKKEEPING",
    "DatasetLocation",
    "PolicyFeatures",
    "cached_dataset_ids",
    "demo_root",
    "hub_cache_dir",
    "hub_dataset_folder",
    "lerobot_home",
    "locate_meta",
    "lr_cache_dir",
    "policy_features",
]

BOOKKEEPING = ("timestamp", "frame_index", "episode_index", "index", "task_index")
"""The per-frame columns every LeRobot dataset has; never a policy input."""


def lr_cache_dir() -> Path:
    if os.environ.get("LR_CACHE_DIR"):
        return Path(os.environ["LR_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lr"


def demo_root(repo_id: str = DEMO_REPO_ID) -> Path:
    return lr_cache_dir() / "datasets" / repo_id


def lerobot_home() -> Path:
    return Path(os.environ.get("HF_LEROBOT_HOME") or Path.home() / ".cache" / "huggingface" / "lerobot")


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache: HF_HUB_CACHE, else $HF_HOME/hub, else the default."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(os.path.expandvars(explicit)).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    home = os.environ.get("HF_HOME") or os.path.join(xdg, "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def hub_dataset_folder(repo_id: str, cache: Path | None = None) -> Path:
    """The dataset's folder in the hub cache (`cache`, else `hub_cache_dir()`), as huggingface_hub names it."""
    return (cache if cache is not None else hub_cache_dir()) / f"datasets--{repo_id.replace('/', '--')}"


@dataclass(frozen=True)
class PolicyFeatures:
    inputs: dict[str, FeatureSpec]
    outputs: dict[str, FeatureSpec]
    ignored: list[str] = field(default_factory=list)
    """Features of the dataset that no policy input takes (besides the bookkeeping columns)."""


def policy_features(info: dict[str, Any], where: str) -> PolicyFeatures:
    """The policy's inputs and outputs from `meta/info.json`'s features (the module docstring's
    rule); a ConfigError naming `where` when there is no action or no observation to learn from."""
    inputs: dict[str, FeatureSpec] = {}
    outputs: dict[str, FeatureSpec] = {}
    ignored: list[str] = []
    for key, feat in dict(info.get("features", {})).items():
        if key in BOOKKEEPING:
            continue
        shape = [int(s) for s in feat.get("shape", [])]
        if feat.get("dtype") in ("image", "video") and len(shape) == 3:
            inputs[key] = FeatureSpec(type="VISUAL", shape=[shape[2], shape[0], shape[1]])
        elif key == "action":
            outputs[key] = FeatureSpec(type="ACTION", shape=shape)
        elif key == "observation.environment_state":
            inputs[key] = FeatureSpec(type="ENV", shape=shape)
        elif key.startswith("observation.state"):
            inputs[key] = FeatureSpec(type="STATE", shape=shape)
        else:
            ignored.append(key)
    if "action" not in outputs:
        raise ConfigError(f"{where}: the dataset has no 'action' feature to learn")
    if not inputs:
        raise ConfigError(f"{where}: the dataset has no observation.* features")
    return PolicyFeatures(inputs, outputs, ignored)


Where = Literal["local", "demo", "lerobot", "hub-cache", "not-cached", "missing"]


@dataclass(frozen=True)
class DatasetLocation:
    """Where a dataset's `meta/` is on this machine, found without the network."""

    where: Where
    meta_dir: Path | None
    """The folder holding `meta/info.json`, or None when it is not on this machine (yet)."""
    note: str
    """One line for a person: where it is, or what a run will do to get it."""

    def info(self) -> dict[str, Any] | None:
        if self.meta_dir is None:
            return None
        return read_json_object(self.meta_dir / "meta" / "info.json")


def locate_meta(repo_id: str, root: Path | None, revision: str | None = None) -> DatasetLocation:
    """Where `--dataset.repo_id`/`--dataset.root`/`--dataset.revision` point on this machine,
    in the order lr-engine looks (the module docstring), reading no file but `meta/info.json`'s presence."""
    if root is not None:
        if (Path(root) / "meta" / "info.json").is_file():
            return DatasetLocation("local", Path(root), f"local folder {root}")
        what = "does not exist" if not Path(root).exists() else "is not a LeRobot v3 dataset (no meta/info.json)"
        return DatasetLocation("missing", None, f"--dataset.root: {root} {what}")
    if repo_id == DEMO_REPO_ID:
        folder = demo_root(repo_id)
        if (folder / "meta" / "info.json").is_file():
            return DatasetLocation("demo", folder, f"the embedded demo, generated in {folder}")
        return DatasetLocation("demo", None, "the embedded demo, generated by the first run")
    copy = lerobot_home() / repo_id
    if revision is None and (copy / "meta" / "info.json").is_file():
        return DatasetLocation("lerobot", copy, f"LeRobot's download in {copy}")
    snapshot = _cached_snapshot(repo_id, revision)
    if snapshot is not None:
        return DatasetLocation("hub-cache", snapshot, f"cached from the Hub in {snapshot.parent.parent} (commit {snapshot.name[:12]}); "
                                                      "episodes not cached yet are downloaded when the run starts")
    at = f" at {revision}" if revision else ""
    return DatasetLocation("not-cached", None, f"not on this machine: {repo_id}{at} is downloaded from the Hub when the run starts")


def _cached_snapshot(repo_id: str, revision: str | None) -> Path | None:
    """The cached snapshot holding meta/info.json: `revision`'s (a ref or a commit) when given,
    else the one a ref (main, or a v3.x tag) points to, else the newest."""
    folder = hub_dataset_folder(repo_id)
    snapshots = folder / "snapshots"
    if not snapshots.is_dir():
        return None
    refs = folder / "refs"
    commits: list[str] = []
    names = [revision] if revision is not None else ["main", *sorted((p.name for p in refs.glob("v3*")), reverse=True)] if refs.is_dir() else []
    for name in names:
        ref = refs / name
        commits.append(ref.read_text().strip() if ref.is_file() else name)
    if revision is None:
        commits += [p.name for p in sorted(snapshots.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)]
    return next((snapshots / c for c in commits if (snapshots / c / "meta" / "info.json").is_file()), None)


def cached_dataset_ids() -> list[str]:
    """The repo ids of the datasets on this machine (the demo, LeRobot's downloads, the hub cache)."""
    ids = {DEMO_REPO_ID}
    home = lerobot_home()
    if home.is_dir():
        ids |= {f"{p.parent.parent.name}/{p.parent.name}" for p in home.glob("*/*/meta") if (p / "info.json").is_file()}
    cache = hub_cache_dir()
    if cache.is_dir():
        for folder in cache.glob("datasets--*--*"):
            org, _, name = folder.name.removeprefix("datasets--").partition("--")
            if any((s / "meta" / "info.json").is_file() for s in (folder / "snapshots").glob("*")):
                ids.add(f"{org}/{name}")
    return sorted(ids)
