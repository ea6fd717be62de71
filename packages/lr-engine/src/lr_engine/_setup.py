"""Building the pieces of a run, each in one named step. Called on every rank.

Order (the two-phase resume of docs/architecture.md, The order of a run):
1. `prepare_output` (main rank decides the folder, every rank agrees on it);
2. `build_data`: dataset, processors and the rank-independent sampler, positioned at the
   resumed step;
3. `build_policy`: seeded identically on every rank (fine-tune base from `--policy.path`;
   a resume reads the base only for LoRA: a full fine-tune's checkpoint holds every weight,
   and its saved policy config is the architecture);
4. RNG restore (phase 1 of resume, before wrapping);
5. `parallelize`: nothing, DDP or FSDP2/HSDP;
6. optimizer, scaler; then model and optimizer state (phase 2, resharded by DCP).
"""

from __future__ import annotations

import datetime as _dt
import os
import random
import signal
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from lr_checkpoint import list_step_dirs
from lr_config import (
    ConfigError,
    DatasetConfig,
    PolicyConfigBase,
    TrainConfig,
    TrainingStep,
    holds_a_run,
    load_policy_config,
)
from lr_config.layout import ADAPTER_CONFIG, CHECKPOINTS, LAST, MODEL_WEIGHTS, RUN_STATUS, TRAIN_CONFIG, TRAIN_OUTPUTS, last_train_config
from torch import nn

from ._data.dataset import LeRobotDataset
from ._data.locate import locate_dataset
from ._data.sampler import DataPosition, GlobalOrderBatchSampler, resume_position
from ._parallel.dist import DistContext
from ._parallel.wrap import WrapPlan, apply_ddp, apply_fsdp, plan_wrap
from ._policies.base import Policy
from ._policies.registry import load_weights, make_policy
from ._processors import Normalizer, make_processors


def broadcast_object(value: Any, ctx: DistContext) -> Any:
    if not ctx.distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def default_output_dir(cfg: TrainConfig) -> Path:
    now = _dt.datetime.now()
    return TRAIN_OUTPUTS / now.strftime("%Y-%m-%d") / f"{now.strftime('%H-%M-%S')}_{cfg.job_name}"


def unusable_output(out: Path) -> str:
    """Why `out` cannot be the run folder (what stands in the way), or "" when it is a folder
    or can be made one: checked before anything is written, so that a bad --output_dir is a
    clear refusal, not an OSError midway through start-up."""
    probe = out
    while not probe.exists() and not probe.is_symlink() and probe.parent != probe:
        probe = probe.parent  # the nearest part of the path that is there
    where = "is" if probe == out else f"cannot be created: {probe} is"
    if not probe.is_dir():
        return f"--output_dir: {out} {where} not a folder; choose another --output_dir"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"--output_dir: {out} {where} not writable; choose another --output_dir"
    return ""


def resume_target_problem(out: Path, step_dir: Path) -> str:
    """Why a resume of `step_dir` must not write into `out`, or "".

    A resume continues the run whose checkpoints/ holds `step_dir`, in its own folder, or
    starts a new folder. Another run's folder is refused (its metrics, `last` and step
    folders would be mixed with this one's), and so is the own folder when `last` names a
    checkpoint after `step_dir`: the resumed run would replace the later ones as it reaches
    them, `last`'s among them."""
    if not holds_a_run(out):
        return ""
    checkpoints = out / CHECKPOINTS
    if step_dir.parent != checkpoints.resolve():
        return (
            f"--output_dir: {out} already holds another run (the checkpoint {step_dir} is not one of its checkpoints); "
            f"a resume continues in the folder of the run that holds the checkpoint ({step_dir.parent.parent}) or in a new "
            "--output_dir"
        )
    later = [p.name for p in list_step_dirs(checkpoints) if int(p.name) > int(step_dir.name)]
    # with `last` on step_dir, a later folder is what a save interrupted before moving `last`
    # left (never committed): the resumed run replaces it, as that save would have
    if later and (checkpoints / LAST).resolve() != step_dir:
        return (
            f"--config_path: resuming {step_dir.name} of {out}, which has later checkpoints ({', '.join(later)}) that the "
            "resumed run would replace as it reaches them; resume into a new --output_dir, or resume the latest with "
            f"--config_path={checkpoints / LAST}"
        )
    return ""


def prepare_output(cfg: TrainConfig, ctx: DistContext, resume_step_dir: Path | None = None) -> TrainConfig:
    """Fill job_name/output_dir; refuse to reuse a run folder without --resume, and a folder a
    resume of `resume_step_dir` must not write into (`resume_target_problem`)."""
    job = cfg.job_name or cfg.policy.type_name
    cfg = replace(cfg, job_name=job)
    decided: tuple[str, str] | None = None
    if ctx.is_main:
        out = cfg.output_dir or default_output_dir(cfg)
        problem = unusable_output(out)
        if not problem and not cfg.resume and holds_a_run(out):
            what = "a run" if any((out / name).exists() for name in (TRAIN_CONFIG, CHECKPOINTS, RUN_STATUS)) else "files"
            problem = (
                f"--output_dir: {out} already holds {what}; choose another --output_dir, or continue that run with "
                f"--resume=true --config_path={last_train_config(out / CHECKPOINTS)}"
            )
        if not problem and resume_step_dir is not None:
            problem = resume_target_problem(out, resume_step_dir)
        decided = (str(out), problem)
    out_str, problem = broadcast_object(decided, ctx)
    if problem:
        raise ConfigError(problem)
    return replace(cfg, output_dir=Path(out_str))


@dataclass
class Data:
    dataset: LeRobotDataset
    sampler: GlobalOrderBatchSampler
    loader: torch.utils.data.DataLoader[Any]
    pre: Normalizer
    post: Normalizer
    exact_position: bool


def policy_horizon(cfg: TrainConfig) -> int:
    return cfg.policy.chunk_size


def holds_adapters(path: Path) -> bool:
    """`path` is a LoRA checkpoint's model folder: adapters (adapter_config.json) and no full weights."""
    return (path / ADAPTER_CONFIG).is_file() and not (path / MODEL_WEIGHTS).is_file()


def reads_base(cfg: TrainConfig) -> bool:
    """Whether the run reads the base at --policy.path: a fine-tune's start, and any LoRA run (its
    checkpoints hold only the adapters). A full fine-tune's resume does not: its checkpoint
    holds every weight, and the saved policy config is its architecture, so it resumes even
    when the base is gone."""
    return cfg.policy.path is not None and (not cfg.resume or cfg.peft.method_type is not None)


def _base_config(cfg: TrainConfig, resume_step_dir: Path | None) -> PolicyConfigBase:
    assert cfg.policy.path is not None
    try:
        return load_policy_config(cfg.policy.path)
    except ConfigError as exc:
        if resume_step_dir is None:
            raise
        raise ConfigError(
            f"{exc}\nThe LoRA checkpoint {resume_step_dir} holds only the adapters; it resumes on the base model they were "
            f"trained on: put it back at {cfg.policy.path}, or pass --policy.path=<where it is now>"
        ) from None


def resolve_features(cfg: TrainConfig, ctx: DistContext, resume_step_dir: Path | None = None) -> TrainConfig:
    """Fill the dataset root and the policy's features (from --policy.path or the dataset)."""
    policy = cfg.policy
    if reads_base(cfg):  # before the demo dataset may be generated: a bad path writes nothing
        # the parser started the policy settings from its config.json and merged the flags over
        # them; a config file naming the path may still hold another type
        base = _base_config(cfg, resume_step_dir)
        if type(base) is not type(policy):
            raise ConfigError(f"--policy.path: {policy.path} holds a {base.type_name!r} policy, but --policy.type is {policy.type_name!r}")
        if holds_adapters(Path(str(policy.path))) and cfg.peft.method_type is not None:
            raise ConfigError(f"--policy.path: {policy.path} holds LoRA adapters, not a full model; new adapters need a full base: "
                              "fine-tune it in full (no --peft.method_type), or pass the base the adapters were trained on")
    root = locate_dataset(cfg.dataset, ctx)  # one process per node downloads (or makes the demo); the others wait
    from ._data.dataset import load_meta

    meta = load_meta(root)
    if policy.input_features is None or policy.output_features is None:
        inputs, outputs = meta.policy_features()
        policy = replace(policy, input_features=inputs, output_features=outputs)
    _check_features_present(policy.input_features or {}, meta.features, root)
    return replace(cfg, dataset=replace(cfg.dataset, root=root), policy=policy)


def _check_features_present(inputs: dict[str, Any], features: dict[str, Any], root: Path) -> None:
    missing = [k for k in inputs if k not in features]
    if missing:
        raise ConfigError(f"{root / 'meta' / 'info.json'}: the policy needs features {missing} that the dataset does not have")


def dataset_changes(old: DatasetConfig, new: DatasetConfig) -> list[str]:
    """The dataset settings a resume changes. Another folder may hold the same dataset (moved
    with the run) or another one: lr cannot tell, so it is never called sample-exact either."""
    keys = ("repo_id", "revision", "root", "episodes")
    return [f"dataset.{k} {getattr(old, k)} -> {getattr(new, k)}" for k in keys if getattr(old, k) != getattr(new, k)]


def build_data(cfg: TrainConfig, ctx: DistContext, resumed: TrainingStep | None, saved_dataset: DatasetConfig | None = None) -> Data:
    """The dataset, its loader and processors; on a resume, from the checkpoint's data position
    (exact only with the same global batch, seed and dataset: `saved_dataset` is the checkpoint's)."""
    assert cfg.dataset.root is not None
    ds = cfg.dataset
    dataset = LeRobotDataset(
        ds.root, episodes=ds.episodes, action_horizon=policy_horizon(cfg), video_backend=ds.video_backend, tolerance_s=ds.tolerance_s,
        image_transforms=ds.image_transforms, seed=cfg.seed,
    )
    topo = ctx.topology
    global_batch = cfg.batch_size * topo.dp_world_size
    start, exact = DataPosition(0, 0), True
    if resumed is not None:
        old_global = resumed.batch_size * resumed.dp_world_size
        saved = None if resumed.epoch_offset is None else (resumed.epoch, resumed.epoch_offset)
        start, exact = resume_position(resumed.step, old_global, global_batch, len(dataset), saved)
        exact = exact and resumed.seed == cfg.seed  # the order of every epoch follows the seed
        exact = exact and (saved_dataset is None or not dataset_changes(saved_dataset, cfg.dataset))
    sampler = GlobalOrderBatchSampler(
        len(dataset), seed=cfg.seed, batch_size=cfg.batch_size, dp_world_size=topo.dp_world_size, dp_rank=ctx.dp_rank, start=start,
        numbered=ds.image_transforms.enable,
    )
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=cfg.num_workers,
        pin_memory=ctx.device.type == "cuda",
        persistent_workers=cfg.num_workers > 0,
        # Its own generator: creating the iterator must not draw from the global RNG, or a
        # resumed run (which creates it after restoring the RNG) would diverge.
        generator=torch.Generator().manual_seed(cfg.seed),
        worker_init_fn=ignore_interrupts,
    )
    assert cfg.policy.input_features is not None and cfg.policy.output_features is not None
    pre, post = make_processors(cfg.policy.input_features, cfg.policy.output_features, dict(cfg.policy.normalization_mapping), dataset.meta.stats)
    return Data(dataset=dataset, sampler=sampler, loader=loader, pre=pre, post=post, exact_position=exact)


def ignore_interrupts(worker_id: int) -> None:
    """In each DataLoader worker: Ctrl+C reaches every process of the terminal's foreground group,
    and a worker that took it would exit and fail the main process's next batch, so a clean stop
    (decided by the main process, which then shuts its workers down) would crash instead."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_policy(cfg: TrainConfig, device: torch.device) -> nn.Module:
    """The policy with identical initial weights on every rank (the base's weights when
    fine-tuning; a resume loads the checkpoint's over them), wrapped with LoRA adapters when
    --peft.method_type is set."""
    seed_everything(cfg.seed)
    policy: nn.Module = make_policy(cfg.policy)
    if cfg.policy.path is None and not cfg.resume:
        _pretrained_backbone(policy)
    if reads_base(cfg):
        assert cfg.policy.path is not None
        if holds_adapters(Path(cfg.policy.path)):  # a LoRA checkpoint: its adapters merged into its recorded base
            from ._adapters import load_adapter_policy

            merged = load_adapter_policy(Path(cfg.policy.path)).merge_and_unload()
            policy.load_state_dict(merged.state_dict())
        else:
            load_weights(policy, cfg.policy.path)
    if cfg.peft.method_type is not None:
        from ._adapters import apply_lora

        policy = apply_lora(policy, cfg)
    return policy.to(device)


def _pretrained_backbone(policy: nn.Module) -> None:
    """A fresh ACT with images starts its backbone from --policy.pretrained_backbone_weights."""
    from ._policies.act import ACTPolicy

    if isinstance(policy, ACTPolicy) and policy.cfg.pretrained_backbone_weights and policy.model.image_keys:
        from ._policies.backbone_weights import load_backbone_weights

        load_backbone_weights(policy.model.backbone, policy.cfg.pretrained_backbone_weights)


def policy_type(model: nn.Module) -> type[Policy]:
    """The policy class inside a (PEFT-wrapped) model."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    assert isinstance(inner, Policy)
    return type(inner)


def parallelize(policy: nn.Module, cfg: TrainConfig, ctx: DistContext) -> tuple[nn.Module, WrapPlan | None]:
    topo = ctx.topology
    if topo.layout == "single":
        return policy, None
    if topo.layout == "ddp":
        return apply_ddp(policy, cfg, ctx), None
    plan = plan_wrap(policy, cfg, policy_type(policy)._fsdp_wrap_modules)
    return apply_fsdp(policy, cfg, ctx, plan), plan


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]
