"""Validation of a TrainConfig, before anything is built.

`validate(cfg, world_size)` collects every problem it finds and raises one ConfigError
that lists them, each starting with the flag to change. `check_repo_id` is the one rule
for Hub repo ids, shared by the engine, checkpoint and publish CLIs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

from ._configs import BACKBONE_WEIGHTS, TRAIN_CONFIG_VERSION, TRANSFORM_TYPES, ACTConfig, DatasetConfig, MLPConfig, FSDPConfig, ImageTransformConfig, TrainConfig
from ._errors import ConfigError, did_you_mean
from ._files import load_train_config
from ._topology import Topology, _check_degrees, resolve_topology
from .layout import CHECKPOINTS, last_train_config

__all__ = ["DEVICE_KINDS", "check_repo_id", "device_problem", "validate"]

DEVICE_KINDS = ("cpu", "cuda", "mps", "xpu")
"""What `--policy.device` may name (with `:<index>` for cuda and xpu); whether this machine has
it is the engine's check, at start-up."""


def device_problem(device: str) -> str | None:
    """Why `--policy.device=<device>` names no device kind lr knows, or None."""
    kind, colon, index = device.partition(":")
    if kind not in DEVICE_KINDS:
        hint = " (did you mean 'cuda'? an NVIDIA or AMD GPU is cuda)" if kind.lower() == "gpu" else did_you_mean(kind, DEVICE_KINDS)
        return f"--policy.device: unknown device kind {kind!r}{hint}; known kinds: {', '.join(DEVICE_KINDS)}"
    if colon and not index.isdigit():
        return f"--policy.device: {device!r} is not a device: expected {kind} or {kind}:<index>"
    return None

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")


def check_repo_id(repo_id: str, flag: str = "--policy.repo_id") -> str:
    """Return repo_id if it is a valid `user/name` Hub id; raise naming `flag` otherwise."""
    bad = (
        not _REPO_ID.match(repo_id)
        or ".." in repo_id
        or "--" in repo_id
        or repo_id.endswith((".", "-", ".git"))
    )
    if bad:
        raise ConfigError(
            f"{flag}: {repo_id!r} is not a valid Hub repo id; expected user/name with letters, "
            "digits, '-', '_' and '.' (no '..' or '--', at most 96 characters each)"
        )
    return repo_id


def _positive(problems: list[str], flag: str, value: float, minimum: float = 1) -> None:
    if value < minimum:
        problems.append(f"--{flag}: must be >= {minimum:g}, got {value}")


def _finite_rules(value: Any, path: str = "") -> list[str]:
    """Every float setting is finite: JSON parses NaN and Infinity, and NaN passes any `<` rule."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [f"--{path}: must be a finite number, got {value}"]
    if isinstance(value, list) and not all(math.isfinite(v) for v in value if isinstance(v, float)):
        return [f"--{path}: must hold finite numbers, got {value}"]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        prefix = f"{path}." if path else ""
        return [p for f in dataclasses.fields(value) for p in _finite_rules(getattr(value, f.name), prefix + f.name)]
    return []


_RANGE_LIMITS: dict[str, tuple[float, float]] = {
    "brightness": (0.0, math.inf),
    "contrast": (0.0, math.inf),
    "saturation": (0.0, math.inf),
    "hue": (-0.5, 0.5),
    "sharpness": (0.0, math.inf),
    "degrees": (-180.0, 180.0),
    "translate": (0.0, 1.0),
}
"""What each transform range may hold (as torchvision's transforms, which LeRobot's are)."""


def _transform_rules(name: str, tf: ImageTransformConfig) -> list[str]:
    flag = f"--dataset.image_transforms.tfs.{name}"
    p: list[str] = []
    if not (math.isfinite(tf.weight) and tf.weight >= 0):
        p.append(f"{flag}.weight: must be a finite number >= 0, got {tf.weight}")
    allowed = TRANSFORM_TYPES[tf.type]
    for key, bounds in tf.kwargs.items():
        if key not in allowed:
            p.append(f"{flag}.kwargs: {tf.type} takes {', '.join(allowed)}, not {key!r}{did_you_mean(key, list(allowed))}")
            continue
        low, high = _RANGE_LIMITS[key]
        ok = len(bounds) == 2 and all(math.isfinite(b) and low <= b <= high for b in bounds)
        if not ok or (key != "translate" and bounds[0] > bounds[1]):
            p.append(f"{flag}.kwargs.{key}: expected [low, high] with {low:g} <= low <= high <= {high:g}, got {bounds}")
    return p


def _dataset_rules(ds: DatasetConfig) -> list[str]:
    p: list[str] = []
    if ds.episodes is not None and (any(e < 0 for e in ds.episodes) or len(set(ds.episodes)) != len(ds.episodes)):
        p.append(f"--dataset.episodes: expected distinct episode indices >= 0, got {ds.episodes}")
    if not (math.isfinite(ds.tolerance_s) and ds.tolerance_s >= 0):
        p.append(f"--dataset.tolerance_s: must be a finite number of seconds >= 0, got {ds.tolerance_s}")
    if ds.revision is not None and not ds.revision.strip():
        p.append("--dataset.revision: empty; give a branch, tag or commit, or leave it unset")
    transforms = ds.image_transforms
    _positive(p, "dataset.image_transforms.max_num_transforms", transforms.max_num_transforms)
    for name, tf in transforms.tfs.items():
        p += _transform_rules(name, tf)
    return p


def _scalar_rules(cfg: TrainConfig) -> list[str]:
    p: list[str] = []
    if cfg.version != TRAIN_CONFIG_VERSION:
        p.append(f"--version: train_config schema version {cfg.version} is not supported (expected {TRAIN_CONFIG_VERSION})")
    _positive(p, "steps", cfg.steps)
    _positive(p, "batch_size", cfg.batch_size)
    _positive(p, "log_freq", cfg.log_freq)
    _positive(p, "save_freq", cfg.save_freq)
    _positive(p, "num_workers", cfg.num_workers, 0)
    _positive(p, "checkpoint_keep", cfg.checkpoint_keep, 0)
    _positive(p, "accelerator.gradient_accumulation.steps", cfg.grad_accum_steps)
    k = cfg.grad_accum_steps
    if k > 1 and 1 <= cfg.steps < k:
        p.append(f"--steps: must be >= --accelerator.gradient_accumulation.steps ({k}) for one optimizer update to happen, got {cfg.steps}")
    if cfg.optimizer.lr <= 0:
        p.append(f"--optimizer.lr: must be > 0, got {cfg.optimizer.lr}")
    if cfg.optimizer.grad_clip_norm < 0:
        p.append(f"--optimizer.grad_clip_norm: must be >= 0, got {cfg.optimizer.grad_clip_norm}")
    if cfg.optimizer.weight_decay < 0:
        p.append(f"--optimizer.weight_decay: must be >= 0, got {cfg.optimizer.weight_decay}")
    if cfg.optimizer.eps <= 0:
        p.append(f"--optimizer.eps: must be > 0, got {cfg.optimizer.eps}")
    if len(cfg.optimizer.betas) != 2 or not all(0 <= b < 1 for b in cfg.optimizer.betas):
        p.append(f"--optimizer.betas: expected two values in [0, 1), got {cfg.optimizer.betas}")
    _positive(p, "scheduler.warmup_steps", cfg.scheduler.warmup_steps, 0)
    if not 0 <= cfg.scheduler.min_lr_ratio <= 1:
        p.append(f"--scheduler.min_lr_ratio: must be in [0, 1], got {cfg.scheduler.min_lr_ratio}")
    if cfg.scheduler.decay_steps is not None and cfg.scheduler.decay_steps <= cfg.scheduler.warmup_steps:
        p.append(
            f"--scheduler.decay_steps: must be above --scheduler.warmup_steps ({cfg.scheduler.warmup_steps}), got "
            f"{cfg.scheduler.decay_steps}; leave it unset to decay over --steps"
        )
    if cfg.world_size is not None and cfg.world_size < 1:
        p.append(f"--world_size: must be >= 1, got {cfg.world_size}")
    elif cfg.world_size is not None and not cfg.dry_run:
        p.append(
            f"--world_size: only plans a --dry_run=true (a run takes its process count from the launcher: "
            f"torchrun --nproc-per-node={cfg.world_size}); add --dry_run=true or drop --world_size"
        )
    return p


def _policy_rules(cfg: TrainConfig) -> list[str]:
    p: list[str] = []
    pol = cfg.policy
    if pol.device and (problem := device_problem(pol.device)):  # "" is unset, as in the engine
        p.append(problem)
    _positive(p, "policy.chunk_size", pol.chunk_size)
    _positive(p, "policy.n_action_steps", pol.n_action_steps)
    if pol.n_action_steps > pol.chunk_size:
        p.append(f"--policy.n_action_steps: must be <= --policy.chunk_size ({pol.chunk_size}), got {pol.n_action_steps}")
    dropout = getattr(pol, "dropout", 0.0)
    if not 0 <= dropout < 1:
        p.append(f"--policy.dropout: must be in [0, 1), got {dropout}")
    if isinstance(pol, ACTConfig):
        for name in ("dim_model", "n_heads", "dim_feedforward", "n_encoder_layers", "n_decoder_layers", "latent_dim", "n_vae_encoder_layers"):
            _positive(p, f"policy.{name}", getattr(pol, name))
        if pol.n_heads >= 1 and pol.dim_model % pol.n_heads:
            p.append(f"--policy.dim_model: must be divisible by --policy.n_heads ({pol.n_heads}), got {pol.dim_model}")
        p += _act_rules(pol)
    elif isinstance(pol, MLPConfig):
        _positive(p, "policy.hidden_dim", pol.hidden_dim)
        _positive(p, "policy.n_layers", pol.n_layers)
    elif callable(rules := getattr(pol, "problems", None)):  # a plugin's own rules (docs/plugins.md)
        p += [str(line) for line in rules()]
    if pol.repo_id:
        try:
            check_repo_id(pol.repo_id)
        except ConfigError as exc:
            p.append(str(exc))
    return p


def _act_rules(pol: ACTConfig) -> list[str]:
    p: list[str] = []
    if pol.n_obs_steps != 1:
        p.append(f"--policy.n_obs_steps: ACT takes one observation step (1), got {pol.n_obs_steps}")
    if pol.vision_backbone not in BACKBONE_WEIGHTS:
        p.append(f"--policy.vision_backbone: expected one of {', '.join(BACKBONE_WEIGHTS)}, got {pol.vision_backbone!r}"
                 f"{did_you_mean(pol.vision_backbone, BACKBONE_WEIGHTS)}")
    elif pol.pretrained_backbone_weights is not None and pol.pretrained_backbone_weights not in BACKBONE_WEIGHTS[pol.vision_backbone]:
        known = BACKBONE_WEIGHTS[pol.vision_backbone]
        p.append(f"--policy.pretrained_backbone_weights: {pol.vision_backbone} takes {' or '.join(known)} (or null: from scratch), "
                 f"got {pol.pretrained_backbone_weights!r}")
    if pol.replace_final_stride_with_dilation and pol.vision_backbone in ("resnet18", "resnet34"):
        p.append(f"--policy.replace_final_stride_with_dilation: {pol.vision_backbone}'s blocks cannot dilate (as in torchvision); "
                 "use --policy.vision_backbone=resnet50 or leave it false")
    if pol.temporal_ensemble_coeff is not None and pol.n_action_steps != 1:
        p.append(f"--policy.temporal_ensemble_coeff: needs --policy.n_action_steps=1 (a chunk every step), got {pol.n_action_steps}")
    return p


def _accelerator_rules(cfg: TrainConfig) -> list[str]:
    p: list[str] = []
    fsdp = cfg.accelerator.fsdp
    if fsdp.wrap_modules is not None and fsdp.min_num_params is not None:
        p.append("--accelerator.fsdp.wrap_modules and --accelerator.fsdp.min_num_params are exclusive: set only one")
    if fsdp.wrap_modules is not None and not fsdp.wrap_modules:
        p.append("--accelerator.fsdp.wrap_modules: empty list; give class names or leave it unset")
    if fsdp.min_num_params is not None and fsdp.min_num_params < 1:
        p.append(f"--accelerator.fsdp.min_num_params: must be >= 1, got {fsdp.min_num_params}")
    if fsdp.ignored_modules is not None:
        try:
            re.compile(fsdp.ignored_modules)
        except re.error as exc:
            p.append(f"--accelerator.fsdp.ignored_modules: not a valid regex ({exc})")
    if cfg.policy.dtype == "bfloat16" and cfg.accelerator.mixed_precision == "fp16":
        p.append("--policy.dtype=bfloat16 with --accelerator.mixed_precision=fp16: fp16 autocast over bfloat16 parameters "
                 "computes in neither; use --accelerator.mixed_precision=bf16 or no")
    if cfg.policy.dtype == "bfloat16" and cfg.peft.method_type is not None and cfg.accelerator.mixed_precision == "no":
        p.append("--policy.dtype=bfloat16 with --peft.method_type: the adapters train in float32 beside the bfloat16 base, "
                 "which needs --accelerator.mixed_precision=bf16 (or --policy.dtype=float32)")
    mpp = fsdp.mixed_precision_policy
    for name in ("param_dtype", "reduce_dtype", "output_dtype"):
        if getattr(mpp, name) == "float16" and cfg.accelerator.mixed_precision != "fp16":
            p.append(
                f"--accelerator.fsdp.mixed_precision_policy.{name}=float16 needs --accelerator.mixed_precision=fp16 "
                "(fp16 needs the loss scaler that mode builds)"
            )
    return p


def _run_rules(cfg: TrainConfig) -> list[str]:
    p: list[str] = []
    if cfg.resume and cfg.config_path is None:
        p.append(f"--resume=true needs --config_path={last_train_config(Path('<run>') / CHECKPOINTS)}")
    if cfg.checkpoint_async and cfg.checkpoint_format == "safetensors":
        p.append("--checkpoint_async=true needs --checkpoint_format=dcp or safetensors_dcp (a sharded run)")
    peft = cfg.peft
    if peft.method_type is not None:
        if cfg.policy.path is None:
            p.append("--peft.method_type=LORA needs --policy.path=<base model folder> to adapt")
        _positive(p, "peft.r", peft.r)
    if not 0 <= peft.lora_dropout < 1:
        p.append(f"--peft.lora_dropout: must be in [0, 1), got {peft.lora_dropout}")
    return p


def _file_fsdp(cfg: TrainConfig) -> FSDPConfig:
    """The FSDP settings of `cfg`'s --config_path file (the defaults without one, or when it
    cannot be read: the parser read it, so that only happens to a file changed since)."""
    if cfg.config_path is None:
        return FSDPConfig()
    try:
        return load_train_config(cfg.config_path).accelerator.fsdp
    except (ConfigError, OSError):
        return FSDPConfig()


def _changed_fsdp_settings(cfg: TrainConfig) -> list[tuple[str, str]]:
    """The `--accelerator.fsdp.*` settings given for this run: those that differ from the
    --config_path file's (a sharded run's file keeps its own through a resume onto one process,
    for the next sharded resume) or from the defaults, as (flag, the flag that puts it back)."""
    changed: list[tuple[str, str]] = []

    def walk(value: Any, file: Any, default: Any, prefix: str) -> None:
        for f in dataclasses.fields(value):
            mine, theirs, plain = getattr(value, f.name), getattr(file, f.name), getattr(default, f.name)
            if dataclasses.is_dataclass(mine) and not isinstance(mine, type):
                walk(mine, theirs, plain, f"{prefix}.{f.name}")
            elif mine != theirs and mine != plain:
                changed.append((f"--{prefix}.{f.name}={json.dumps(mine)}", f"--{prefix}.{f.name}={json.dumps(theirs)}"))

    walk(cfg.accelerator.fsdp, _file_fsdp(cfg), FSDPConfig(), "accelerator.fsdp")
    return changed


def _topology_rules(cfg: TrainConfig, topo: Topology) -> list[str]:
    p: list[str] = []
    fsdp = _changed_fsdp_settings(cfg) if not topo.sharded and cfg.accelerator.fsdp != FSDPConfig() else []
    if fsdp:
        # accelerate ignores its FSDP plugin in such a run and trains plain DDP without a word;
        # lr refuses instead (docs/architecture.md: a layout never silently becomes another)
        p.append(
            f"--accelerator.fsdp: {' '.join(flag for flag, _ in fsdp)} only apply to a sharded run, and this run is "
            f"{topo.describe()}: shard it (--parallelism.dp_shard=-1 or N), or set them back ({' '.join(back for _, back in fsdp)})"
        )
    return p


def _eval_rules(cfg: TrainConfig) -> list[str]:
    """--eval_freq and the settings of its evaluations (checked only when it is on)."""
    p: list[str] = []
    _positive(p, "eval_freq", cfg.eval_freq, 0)
    if cfg.eval_freq > 0:
        _positive(p, "eval.n_episodes", cfg.eval.n_episodes)
        _positive(p, "eval.batch_size", cfg.eval.batch_size)
        _positive(p, "eval.videos", cfg.eval.videos, 0)
        _positive(p, "env.max_episode_steps", cfg.env.max_episode_steps)
        if not cfg.env.success_radius > 0:
            p.append(f"--env.success_radius: must be > 0, got {cfg.env.success_radius}")
    return p


def validate(cfg: TrainConfig, world_size: int | None = None, nnodes: int = 1) -> Topology | None:
    """Check every rule; return the resolved topology when `world_size` is given."""
    problems = (_finite_rules(cfg) + _scalar_rules(cfg) + _dataset_rules(cfg.dataset) + _policy_rules(cfg) + _accelerator_rules(cfg)
                + _run_rules(cfg) + _eval_rules(cfg))
    topo: Topology | None = None
    try:
        if world_size is None:
            _check_degrees(cfg.parallelism)
        else:
            topo = resolve_topology(cfg.parallelism, world_size, nnodes)
            problems += _topology_rules(cfg, topo)
    except ConfigError as exc:
        problems.append(str(exc))
    if problems:
        head = problems[0] if len(problems) == 1 else f"{len(problems)} problems in the settings:\n  " + "\n  ".join(problems)
        raise ConfigError(head, problems=problems)
    return topo
