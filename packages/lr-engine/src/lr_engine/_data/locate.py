"""Where a run's dataset lives: a local folder, the demo, or a Hub dataset downloaded on demand.

`resolve_dataset_root(cfg)` (one process): `--dataset.root` when given; the embedded demo for
its repo id (generated on first use); else `--dataset.repo_id` from the Hub: a copy LeRobot
itself downloaded (`$HF_LEROBOT_HOME/<repo_id>`, default `~/.cache/huggingface/lerobot`) when
it holds every file the selected episodes need and no `--dataset.revision` is asked for,
otherwise the Hugging Face cache, downloading what is missing (`hub.fetch_dataset`: meta
first, then only the selected episodes' files). `download=False` only looks.

`locate_dataset(cfg, ctx)` (every rank of a run): rank 0 pins the Hub revision to one commit,
one process per node (local rank 0) downloads it or generates the demo, while the others
wait on a gloo group with no practical timeout (`one_per_node`: a download may take hours;
the run's collective timeout must not fire); then every rank reads the same files. A failure on any node is every rank's `DatasetError`,
raised before anything is written to the output folder.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lr_config import DEMO_REPO_ID, DatasetConfig
from lr_config.datasets import lerobot_home

from .demo import demo_root, ensure_demo_dataset
from .errors import DatasetError

if TYPE_CHECKING:
    from .._parallel.dist import DistContext

__all__ = ["lerobot_home", "locate_dataset", "meta_root", "one_per_node", "resolve_dataset_root"]

_WAIT = timedelta(days=7)


def _local_root(root: Path) -> Path:
    if not root.exists():
        raise DatasetError(f"--dataset.root: {root} does not exist; pass the folder of a LeRobot v3 dataset")
    if not (root / "meta" / "info.json").exists():
        raise DatasetError(f"--dataset.root: {root} is not a LeRobot v3 dataset (no meta/info.json)")
    return root


def _demo(repo_id: str, create: bool) -> Path:
    if not create:
        return demo_root(repo_id)
    try:
        return ensure_demo_dataset(repo_id)
    except OSError as exc:
        raise DatasetError(
            f"the demo dataset cannot be generated in {demo_root(repo_id)} ({exc.strerror or exc}: {exc.filename}); "
            "set LR_CACHE_DIR to a writable folder, or pass --dataset.root=<a LeRobot v3 dataset>"
        ) from None


def _lerobot_copy(cfg: DatasetConfig) -> Path | None:
    """LeRobot's own download of the dataset, if it holds every file the episodes need."""
    from .dataset import load_meta
    from .hub import episode_files

    root = lerobot_home() / cfg.repo_id
    if cfg.revision is not None or not (root / "meta" / "info.json").is_file():
        return None
    try:
        needed = episode_files(root, load_meta(root).info, cfg.episodes)
    except DatasetError:
        return None
    return root if all((root / path).is_file() for path in needed) else None


def resolve_dataset_root(cfg: DatasetConfig, *, create_demo: bool = True, download: bool = True) -> Path:
    """The local folder of the dataset (see the module docstring), or a DatasetError that says what to do."""
    if cfg.root is not None:
        return _local_root(Path(cfg.root))
    if cfg.repo_id == DEMO_REPO_ID:
        return _demo(cfg.repo_id, create_demo)
    local = _lerobot_copy(cfg)
    if local is not None:
        return local
    from .hub import fetch_dataset, resolve_revision

    commit = resolve_revision(cfg.repo_id, cfg.revision)
    if not download:
        return _prepared_root(replace(cfg, revision=commit))
    return fetch_dataset(cfg.repo_id, commit, cfg.episodes)


def meta_root(cfg: DatasetConfig) -> Path:
    """A folder holding the dataset's `meta/` (all a dry run reads): only meta is downloaded
    for a Hub dataset, and the demo is not generated (its meta may then be absent)."""
    if cfg.root is not None or cfg.repo_id == DEMO_REPO_ID:
        return resolve_dataset_root(cfg, create_demo=False)
    local = _lerobot_copy(cfg)
    if local is not None:
        return local
    from .hub import fetch_meta, resolve_revision

    return fetch_meta(cfg.repo_id, resolve_revision(cfg.repo_id, cfg.revision))


def _pinned(cfg: DatasetConfig, ctx: DistContext, group: Any) -> DatasetConfig:
    """`cfg` with a Hub dataset's revision resolved by rank 0, so that every node reads one commit."""
    import torch.distributed as dist

    if cfg.root is not None or cfg.repo_id == DEMO_REPO_ID:
        return cfg
    answer: list[Any] = [None]
    if ctx.is_main:
        try:
            local = _lerobot_copy(cfg)
            if local is not None:
                answer = [("root", str(local))]
            else:
                from .hub import resolve_revision

                answer = [("revision", resolve_revision(cfg.repo_id, cfg.revision))]
        except DatasetError as exc:
            answer = [("error", str(exc))]
    dist.broadcast_object_list(answer, src=0, group=group)
    kind, value = answer[0]
    if kind == "error":
        raise DatasetError(value)
    return replace(cfg, root=Path(value)) if kind == "root" else replace(cfg, revision=value)


def one_per_node(ctx: DistContext, work: Callable[[], object], group: Any = None) -> None:
    """Run `work` on local rank 0 of each node while the other ranks wait (collective). A
    DatasetError on any node is raised on every rank. The wait has no practical timeout (a gloo
    group of its own): the run's collective timeout must not fire during a long download."""
    if not ctx.distributed:
        work()
        return
    import torch.distributed as dist

    own = group is None
    group = dist.new_group(backend="gloo", timeout=_WAIT) if own else group
    try:
        problem = ""
        if ctx.local_rank == 0:
            try:
                work()
            except DatasetError as exc:
                problem = str(exc)
        problems: list[str] = [""] * ctx.world_size
        dist.all_gather_object(problems, problem, group=group)
    finally:
        if own:
            dist.destroy_process_group(group)
    first = next((p for p in problems if p), "")
    if first:
        raise DatasetError(first)


def locate_dataset(cfg: DatasetConfig, ctx: DistContext) -> Path:
    """Every rank: the dataset's folder, prepared by one process per node (see the module docstring)."""
    if not ctx.distributed:
        return resolve_dataset_root(cfg)
    import torch.distributed as dist

    group = dist.new_group(backend="gloo", timeout=_WAIT)
    try:
        pinned = _pinned(cfg, ctx, group)
        one_per_node(ctx, lambda: resolve_dataset_root(pinned, create_demo=True, download=True), group)
    finally:
        dist.destroy_process_group(group)
    return _prepared_root(pinned)


def _prepared_root(pinned: DatasetConfig) -> Path:
    """The folder the node's preparing process made ready (no network: the revision is a commit)."""
    if pinned.root is not None or pinned.repo_id == DEMO_REPO_ID:
        return resolve_dataset_root(pinned, create_demo=False)
    from .hub import cached_dataset

    assert pinned.revision is not None
    cached = cached_dataset(pinned.repo_id, pinned.revision)
    if cached is None:
        raise DatasetError(f"--dataset.repo_id: {pinned.repo_id!r} at {pinned.revision} is not in the Hugging Face cache on this node")
    return cached
