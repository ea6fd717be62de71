"""Every training setting as a typed, documented dataclass.

`TrainConfig` is the whole surface of `lr-engine train`. Each field is a flag
(`--accelerator.fsdp.min_num_params=...`); its `doc` metadata is the one line `--help`
shows. Policies are a union tagged by `type` (`--policy.type=act|mlp`).

Contract rules (docs/architecture.md, Contracts): saved files hold every field, unknown keys are errors,
and every file carries `version`. Defaults here are what `uv run lr-engine train` runs: the
embedded demo dataset, and ACT at its demo preset (`demo_act()`, sized to train in well under a
minute on two CPU cores); `ACTConfig()` itself is LeRobot's ACT with LeRobot's defaults.

A dict setting whose keys form a closed set declares it (`sub(..., keys=...)`, read back by
`closed_keys`): `normalization_mapping` is keyed by feature type (the engine looks modes up
by it), so the converter refuses any other key, from flags and files alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

__all__ = [
    "CHECKPOINT_FORMATS",
    "DEMO_REPO_ID",
    "FEATURE_TYPES",
    "TRAIN_CONFIG_VERSION",
    "ACTConfig",
    "BACKBONE_WEIGHTS",
    "DEMO_PRESET_FIELDS",
    "demo_act",
    "demo_preset_note",
    "lerobot_optimizer_note",
    "AcceleratorConfig",
    "ContextParallelConfig",
    "DDPConfig",
    "DatasetConfig",
    "EvalAggregate",
    "EvalConfig",
    "EvalEnvConfig",
    "FSDPConfig",
    "FeatureSpec",
    "GradientAccumulationConfig",
    "HubConfig",
    "ImageTransformConfig",
    "ImageTransformsConfig",
    "MLPConfig",
    "MixedPrecisionPolicyConfig",
    "OptimizerConfig",
    "ParallelismConfig",
    "PeftConfig",
    "PolicyConfig",
    "PolicyConfigBase",
    "SchedulerConfig",
    "TrackioConfig",
    "TrainConfig",
    "POLICY_TYPES",
    "TRANSFORM_TYPES",
    "doc",
]

TRAIN_CONFIG_VERSION = 5
"""train_config.json's version: 2 added `scheduler.decay_steps` and the dataset's `revision`, `video_backend`,
`tolerance_s` and `image_transforms`; 3 added `eval_freq`, `eval` and `env`; 4 made `act` LeRobot's ACT and added
`policy.pretrained_revision`; 5 added `policy.dtype` (older files are upgraded on load; an older ACT is refused by name)."""
DEMO_REPO_ID = "lr/demo_reach2d"
CHECKPOINT_FORMATS = ("safetensors", "dcp", "safetensors_dcp")

CheckpointFormat = Literal["safetensors", "dcp", "safetensors_dcp"]
Precision = Literal["no", "bf16", "fp16"]
DType = Literal["float32", "bfloat16", "float16"]
PolicyDType = Literal["float32", "bfloat16"]
FeatureType = Literal["STATE", "ENV", "VISUAL", "ACTION"]
FEATURE_TYPES: tuple[str, ...] = get_args(FeatureType)
NormMode = Literal["mean_std", "min_max", "identity"]


def doc(default: Any, text: str) -> Any:
    """A dataclass field with a default and its one-line `--help` text."""
    if isinstance(default, (list, dict)):
        value = default
        return field(default_factory=lambda: type(value)(value), metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


def sub(factory: Any, text: str, *, keys: tuple[str, ...] | None = None) -> Any:
    """A nested config field; `keys`, for a dict, is the closed set of keys it may hold."""
    metadata: dict[str, Any] = {"doc": text}
    if keys is not None:
        metadata["keys"] = keys
    return field(default_factory=factory, metadata=metadata)


def closed_keys(f: Any) -> tuple[str, ...] | None:
    """The keys a dict field may hold (its `sub(..., keys=...)`), or None when any key is fine."""
    keys: tuple[str, ...] | None = f.metadata.get("keys")
    return keys


TRANSFORM_TYPES: dict[str, tuple[str, ...]] = {
    "ColorJitter": ("brightness", "contrast", "saturation", "hue"),
    "SharpnessJitter": ("sharpness",),
    "RandomAffine": ("degrees", "translate"),
}
"""LeRobot's image transforms lr implements, with the ranges (`kwargs`) each takes."""


@dataclass
class ImageTransformConfig:
    weight: float = doc(1.0, "Relative chance of being among the transforms drawn for a frame; 0 turns it off.")
    type: Literal["ColorJitter", "SharpnessJitter", "RandomAffine"] = doc("ColorJitter", "ColorJitter, SharpnessJitter or RandomAffine, as in LeRobot.")
    kwargs: dict[str, list[float]] = doc({}, "Its [low, high] ranges, as in LeRobot: brightness, contrast, saturation, hue; sharpness; degrees, translate.")


def _default_tfs() -> dict[str, ImageTransformConfig]:
    """LeRobot 0.6's defaults."""
    return {
        "brightness": ImageTransformConfig(1.0, "ColorJitter", {"brightness": [0.8, 1.2]}),
        "contrast": ImageTransformConfig(1.0, "ColorJitter", {"contrast": [0.8, 1.2]}),
        "saturation": ImageTransformConfig(1.0, "ColorJitter", {"saturation": [0.5, 1.5]}),
        "hue": ImageTransformConfig(1.0, "ColorJitter", {"hue": [-0.05, 0.05]}),
        "sharpness": ImageTransformConfig(1.0, "SharpnessJitter", {"sharpness": [0.5, 1.5]}),
        "affine": ImageTransformConfig(1.0, "RandomAffine", {"degrees": [-5.0, 5.0], "translate": [0.05, 0.05]}),
    }


@dataclass
class ImageTransformsConfig:
    enable: bool = doc(False, "Augment camera frames while training (LeRobot's image transforms), seeded per sample.")
    max_num_transforms: int = doc(3, "Transforms drawn for each frame (by weight, without replacement).")
    random_order: bool = doc(False, "Apply the drawn transforms in a random order instead of the listed one.")
    tfs: dict[str, ImageTransformConfig] = sub(_default_tfs, "The transforms by name, each with weight, type and kwargs.")


@dataclass
class DatasetConfig:
    repo_id: str = doc(
        DEMO_REPO_ID,
        "Hugging Face dataset id (user/name), downloaded when not cached (HF_HOME, HF_HUB_CACHE, HF_ENDPOINT, HF_TOKEN, "
        "HF_HUB_OFFLINE apply). The default is the embedded demo, generated on first use.",
    )
    root: Path | None = doc(None, "Local folder of a LeRobot v3 dataset; wins over repo_id.")
    episodes: list[int] | None = doc(None, "Only these episode indices (JSON list); all when unset. Only their files are downloaded.")
    revision: str | None = doc(None, "Branch, tag or commit of repo_id; unset: the v3.0 tag if the repo has one, else main (as LeRobot).")
    video_backend: Literal["pyav", "torchcodec"] = doc("pyav", "Video decoder: pyav (bundles FFmpeg) or torchcodec (needs a system FFmpeg).")
    tolerance_s: float = doc(1e-4, "How far a decoded video frame may be from the frame's timestamp, in seconds (LeRobot's default).")
    image_transforms: ImageTransformsConfig = sub(ImageTransformsConfig, "Camera-frame augmentation, as LeRobot's.")


@dataclass
class FeatureSpec:
    type: FeatureType = doc("STATE", "STATE, ENV, VISUAL or ACTION.")
    shape: list[int] = doc([], "Feature shape; images are [C, H, W].")


def _default_norm() -> dict[str, NormMode]:
    return {"STATE": "mean_std", "ENV": "mean_std", "VISUAL": "mean_std", "ACTION": "mean_std"}


@dataclass
class PolicyConfigBase:
    """Fields every policy has. Subclasses add their architecture and set `type_name`."""

    type_name: ClassVar[str] = ""

    device: str | None = doc(None, "cuda, mps, xpu or cpu; the best available when unset.")
    dtype: PolicyDType = doc(
        "float32",
        "The policy's parameter dtype: float32, or bfloat16 (parameters, gradients and optimizer state in bfloat16; "
        "the batch is cast to it as it enters the policy). It casts parameters only: autocast is "
        "--accelerator.mixed_precision's.",
    )
    path: Path | None = doc(None, "A saved policy to fine-tune (config.json + model.safetensors, lr's or LeRobot's): a folder or a Hub repo id.")
    pretrained_revision: str | None = doc(None, "Branch, tag or commit of a Hub --policy.path; main when unset.")
    repo_id: str | None = doc(None, "Hub repo id (user/name): the trained model is published there at the end (see push_to_hub).")
    push_to_hub: bool = doc(True, "Publish the trained model to --policy.repo_id at the end of training, as LeRobot does; false to keep it local. Without a repo id nothing is pushed.")
    private: bool = doc(False, "Publish to a private repo: a new repo is created private; an existing public one is refused (visibility is never changed).")
    license: str = doc("apache-2.0", "License written in the model card.")
    input_features: dict[str, FeatureSpec] | None = doc(None, "Inputs; filled from the dataset when unset.")
    output_features: dict[str, FeatureSpec] | None = doc(None, "Outputs; filled from the dataset when unset.")
    normalization_mapping: dict[str, NormMode] = sub(
        _default_norm, "Normalization per feature type (STATE, ENV, VISUAL, ACTION): mean_std, min_max or identity.", keys=FEATURE_TYPES
    )


BACKBONE_WEIGHTS: dict[str, tuple[str, ...]] = {
    "resnet18": ("ResNet18_Weights.IMAGENET1K_V1",),
    "resnet34": ("ResNet34_Weights.IMAGENET1K_V1",),
    "resnet50": ("ResNet50_Weights.IMAGENET1K_V1", "ResNet50_Weights.IMAGENET1K_V2"),
}
"""The ACT image backbones lr builds (torchvision's ResNet layout) and the torchvision weights each can start from."""


def _lerobot_act_norm() -> dict[str, NormMode]:
    """LeRobot's ACT: environment states are not normalized (no ENV entry: identity)."""
    return {"VISUAL": "mean_std", "STATE": "mean_std", "ACTION": "mean_std"}


@dataclass
class ACTConfig(PolicyConfigBase):
    """LeRobot's ACT (Action Chunking with Transformers, Zhao et al., 2023): the same fields,
    defaults, parameter names and files as LeRobot 0.6.1's `act` (docs/lerobot-compat.md)."""

    type_name: ClassVar[str] = "act"
    main_flags: ClassVar[tuple[str, ...]] = ("chunk_size", "n_action_steps", "dim_model", "vision_backbone")
    """The settings lr-tui's Launch form shows for it."""

    normalization_mapping: dict[str, NormMode] = sub(
        _lerobot_act_norm, "Normalization per feature type (STATE, ENV, VISUAL, ACTION): mean_std, min_max or identity; "
        "a type left out is identity (LeRobot's ACT leaves ENV out).", keys=FEATURE_TYPES
    )
    n_obs_steps: int = doc(1, "Observation steps given to the policy (ACT takes 1).")
    chunk_size: int = doc(100, "Number of future actions predicted per step.")
    n_action_steps: int = doc(100, "Actions executed from each predicted chunk (<= chunk_size).")
    vision_backbone: str = doc("resnet18", "Image backbone: resnet18, resnet34 or resnet50 (torchvision's layout).")
    pretrained_backbone_weights: str | None = doc(
        "ResNet18_Weights.IMAGENET1K_V1",
        "torchvision weights the backbone starts from (read from torch's hub cache, downloaded once when missing); "
        "null: from scratch.",
    )
    replace_final_stride_with_dilation: bool = doc(False, "Replace the backbone's last stride with a dilation.")
    pre_norm: bool = doc(False, "Pre-norm transformer blocks (post-norm when false).")
    dim_model: int = doc(512, "Transformer width.")
    n_heads: int = doc(8, "Attention heads.")
    dim_feedforward: int = doc(3200, "Feed-forward width.")
    feedforward_activation: Literal["relu", "gelu", "glu"] = doc("relu", "Feed-forward activation.")
    n_encoder_layers: int = doc(4, "Transformer encoder layers.")
    n_decoder_layers: int = doc(1, "Transformer decoder layers.")
    use_vae: bool = doc(True, "Train with the CVAE latent and KL loss.")
    latent_dim: int = doc(32, "CVAE latent size.")
    n_vae_encoder_layers: int = doc(4, "CVAE encoder layers.")
    temporal_ensemble_coeff: float | None = doc(None, "Temporal ensembling of overlapping chunks (needs n_action_steps=1); null: off.")
    dropout: float = doc(0.1, "Dropout in the transformer.")
    kl_weight: float = doc(10.0, "Weight of the KL term.")
    optimizer_lr: float = doc(1e-5, "LeRobot's training preset lr (kept in the files; lr trains with --optimizer.lr).")
    optimizer_weight_decay: float = doc(1e-4, "LeRobot's training preset weight decay (kept in the files; lr uses --optimizer.weight_decay).")
    optimizer_lr_backbone: float = doc(1e-5, "LeRobot's training preset backbone lr (kept in the files).")


def demo_act() -> ACTConfig:
    """The `demo` preset: LeRobot's ACT sized for the embedded demo on two CPU cores (what
    `lr-engine train` runs when neither --policy.type nor --policy.path is given; the banner
    names it). `--policy.type=act` alone is LeRobot's defaults."""
    return ACTConfig(
        chunk_size=10, n_action_steps=10, dim_model=128, n_heads=4, dim_feedforward=512, n_encoder_layers=2,
        n_vae_encoder_layers=2, pretrained_backbone_weights=None,
    )


DEMO_PRESET_FIELDS = ("chunk_size", "n_action_steps", "dim_model", "n_heads", "dim_feedforward", "n_encoder_layers",
                      "n_vae_encoder_layers", "pretrained_backbone_weights")
"""The ACT fields the demo preset sets (the banner lists them)."""


def demo_preset_note(policy: PolicyConfigBase) -> str | None:
    """`act, demo preset (...)` when `policy` is ACT at the demo preset's sizes, else None."""
    if not isinstance(policy, ACTConfig):
        return None
    preset = demo_act()
    if any(getattr(policy, name) != getattr(preset, name) for name in DEMO_PRESET_FIELDS):
        return None
    shown = ", ".join(f"{name}={getattr(preset, name)}" for name in DEMO_PRESET_FIELDS if name != "pretrained_backbone_weights")
    return f"act, demo preset ({shown}, backbone from scratch); --policy.type=act alone gives LeRobot's defaults"


def lerobot_optimizer_note(cfg: TrainConfig) -> str | None:
    """A banner line when the policy carries LeRobot's training preset (ACT's `optimizer_lr`,
    `optimizer_weight_decay`, `optimizer_lr_backbone`, which `lerobot-train` applies by default)
    and lr's `--optimizer.*`/`--scheduler.*` train otherwise: what lr uses, what LeRobot would,
    and the flags that match it. None for the demo preset (lr's own) and when they agree."""
    policy, opt, sched = cfg.policy, cfg.optimizer, cfg.scheduler
    lr, decay, backbone = (getattr(policy, name, None) for name in ("optimizer_lr", "optimizer_weight_decay", "optimizer_lr_backbone"))
    if not isinstance(lr, float) or not isinstance(decay, float) or demo_preset_note(policy) is not None:
        return None
    wanted = [("optimizer.type", opt.type, "adamw"), ("optimizer.lr", opt.lr, lr), ("optimizer.weight_decay", opt.weight_decay, decay),
              ("scheduler.type", sched.type, "constant"), ("scheduler.warmup_steps", sched.warmup_steps, 0)]
    flags = " ".join(f"--{name}={value:g}" if isinstance(value, float) else f"--{name}={value}" for name, have, value in wanted if have != value)
    same_backbone = backbone is None or backbone == lr
    if not flags and same_backbone:
        return None
    constant = sched.type == "constant" and sched.warmup_steps == 0
    schedule = "constant" if constant else f"{sched.type} after {sched.warmup_steps} warmup steps"
    text = (f"optimizer: {opt.type} lr {opt.lr:g}, weight decay {opt.weight_decay:g}, {schedule}; lerobot-train's preset for "
            f"{policy.type_name} is adamw lr {lr:g}, weight decay {decay:g}, constant")
    if not flags:
        return f"{text}, backbone lr {backbone:g}: lr trains every parameter at --optimizer.lr"
    return (f"{text}: {flags} trains as it does"
            + ("" if same_backbone else f" (but for its backbone lr {backbone:g}: lr trains every parameter at --optimizer.lr)"))


@dataclass
class MLPConfig(PolicyConfigBase):
    """A plain MLP from the current observation to one action chunk. Declares no FSDP wrap units."""

    type_name: ClassVar[str] = "mlp"

    chunk_size: int = doc(1, "Number of future actions predicted per step.")
    n_action_steps: int = doc(1, "Actions executed from each predicted chunk.")
    hidden_dim: int = doc(256, "Hidden width.")
    n_layers: int = doc(3, "Hidden layers.")
    dropout: float = doc(0.0, "Dropout.")


PolicyConfig = ACTConfig | MLPConfig
POLICY_TYPES: dict[str, type[PolicyConfigBase]] = {c.type_name: c for c in (ACTConfig, MLPConfig)}


@dataclass
class OptimizerConfig:
    type: Literal["adamw", "adam", "sgd"] = doc("adamw", "Optimizer.")
    lr: float = doc(1e-3, "Peak learning rate. Never scaled automatically with the batch.")
    weight_decay: float = doc(1e-4, "Weight decay.")
    betas: list[float] = doc([0.9, 0.999], "Adam betas; sgd takes the first as its momentum ([0, 0.999] is plain SGD).")
    eps: float = doc(1e-8, "Adam epsilon.")
    grad_clip_norm: float = doc(10.0, "Clip the global gradient norm to this (0 disables clipping).")


@dataclass
class SchedulerConfig:
    type: Literal["cosine", "linear", "constant"] = doc("cosine", "Decay after warmup.")
    warmup_steps: int = doc(20, "Linear warmup, in loop steps.")
    min_lr_ratio: float = doc(0.1, "Final lr as a fraction of the peak (cosine, linear).")
    decay_steps: int | None = doc(
        None,
        "Loop steps the decay ends at (cosine, linear); --steps when unset. Past it the lr stays at its final value: a resume "
        "with more --steps keeps its checkpoint's schedule when this is the old --steps.",
    )


@dataclass
class ContextParallelConfig:
    ring_degree: int = doc(1, "Reserved: must be 1.")
    ulysses_degree: int = doc(1, "Reserved: must be 1.")


@dataclass
class ParallelismConfig:
    dp_replicate: int | None = doc(None, "Replicate degree (DDP axis). Unset with dp_shard unset: DDP over all processes.")
    dp_shard: int | None = doc(None, "Shard degree (FSDP2 axis); -1 infers it from the launcher.")
    context_parallel: ContextParallelConfig = sub(ContextParallelConfig, "Reserved context-parallel degrees.")


@dataclass
class GradientAccumulationConfig:
    steps: int = doc(1, "Micro-batches per optimizer update; gradients sync only on the last one.")


@dataclass
class MixedPrecisionPolicyConfig:
    param_dtype: DType | None = doc(None, "FSDP2 compute dtype of parameters; any field set replaces the policy derived from mixed_precision.")
    reduce_dtype: DType | None = doc(None, "FSDP2 gradient reduce dtype; unset follows torch: the parameter's own dtype (fp32) from torch 2.15, param_dtype before.")
    output_dtype: DType | None = doc(None, "FSDP2 dtype of module outputs.")
    cast_forward_inputs: bool | None = doc(None, "FSDP2 casts floating inputs to param_dtype (torch default: true).")

    def is_set(self) -> bool:
        return any(v is not None for v in (self.param_dtype, self.reduce_dtype, self.output_dtype, self.cast_forward_inputs))


@dataclass
class FSDPConfig:
    wrap_modules: list[str] | None = doc(None, 'Class names of FSDP units, JSON list: \'["ACTEncoderLayer"]\'.')
    min_num_params: int | None = doc(None, "Wrap every submodule with at least this many parameters.")
    reshard_after_forward: bool = doc(True, "Free gathered parameters after forward (ZeRO-3); false keeps them (ZeRO-2).")
    cpu_offload: bool = doc(False, "Keep parameters, gradients and optimizer state on CPU.")
    ignored_modules: str | None = doc(None, "Regex on module paths left unsharded (PEFT paths start with base_model.model.; begin with .*).")
    mixed_precision_policy: MixedPrecisionPolicyConfig = sub(MixedPrecisionPolicyConfig, "Explicit FSDP2 MixedPrecisionPolicy.")


@dataclass
class DDPConfig:
    find_unused_parameters: bool = doc(False, "DDP find_unused_parameters.")
    gradient_as_bucket_view: bool = doc(False, "DDP gradient_as_bucket_view.")
    static_graph: bool = doc(False, "DDP static_graph.")


@dataclass
class AcceleratorConfig:
    mixed_precision: Precision = doc("no", "no, bf16 or fp16: autocast (single/DDP) or MixedPrecisionPolicy (sharded).")
    gradient_accumulation: GradientAccumulationConfig = sub(GradientAccumulationConfig, "Gradient accumulation.")
    fsdp: FSDPConfig = sub(FSDPConfig, "FSDP2 settings (sharded layouts).")
    ddp: DDPConfig = sub(DDPConfig, "DDP settings (replicate-only layouts).")


@dataclass
class PeftConfig:
    method_type: Literal["LORA"] | None = doc(None, "LORA to train adapters on a --policy.path base; unset trains all weights.")
    r: int = doc(16, "LoRA rank.")
    lora_alpha: int | None = doc(None, "LoRA alpha; unset means r.")
    lora_dropout: float = doc(0.0, "LoRA dropout.")
    target_modules: list[str] | None = doc(None, "Module name suffixes that get adapters; the policy's linear layers when unset.")
    full_training_modules: list[str] | None = doc(None, "Modules trained in full beside the adapters (PEFT modules_to_save).")


@dataclass
class TrackioConfig:
    enable: bool = doc(False, "Also log metrics to trackio (offline, under TRACKIO_DIR).")
    project: str = doc("lr", "trackio project.")
    run_name: str | None = doc(None, "trackio run name; the job name when unset.")


@dataclass
class HubConfig:
    endpoint: str | None = doc(None, "Hub endpoint; HF_ENDPOINT or huggingface.co when unset.")
    revision: str | None = doc(None, "Branch to push to; main when unset.")


@dataclass
class EvalConfig:
    n_episodes: int = doc(50, "Episodes rolled out.")
    batch_size: int = doc(10, "Episodes stepped together (one policy call per step for all of them).")
    videos: int = doc(0, "The first N episodes are also saved as MP4 videos under <output_dir>/videos/.")


@dataclass
class EvalEnvConfig:
    type: Literal["reach2d"] = doc("reach2d", "The environment: lr's demo reaching task (what the demo dataset records).")
    max_episode_steps: int = doc(60, "An episode that has not reached its target after this many steps fails.")
    success_radius: float = doc(0.05, "Success: the agent within this distance of its target (the arena spans -1..1).")


@dataclass
class EvalAggregate:
    n_episodes: int = 0
    success_rate: float = 0.0
    success_ci95_low: float = 0.0
    """The Wilson score interval of the success rate, 95%."""
    success_ci95_high: float = 0.0
    avg_sum_reward: float = 0.0
    avg_length: float = 0.0


@dataclass
class TrainConfig:
    version: int = doc(TRAIN_CONFIG_VERSION, "Schema version of train_config.json.")
    output_dir: Path | None = doc(None, "Run folder; outputs/train/<date>/<time>_<job_name> when unset.")
    job_name: str | None = doc(None, "Run name; the policy type when unset.")
    seed: int = doc(1000, "Seed of the model init and of the global sample order.")
    steps: int = doc(300, "Loop steps (micro-batches per worker), not optimizer updates.")
    batch_size: int = doc(32, "Per-process micro-batch size.")
    num_workers: int = doc(0, "DataLoader worker processes.")
    log_freq: int = doc(25, "Log reduced metrics every N loop steps.")
    save_freq: int = doc(100, "Save a checkpoint every N loop steps, at the update that completes each multiple of N (and at the last update).")
    save_checkpoint: bool = doc(True, "Write checkpoints.")
    checkpoint_format: CheckpointFormat = doc("safetensors", "safetensors, dcp or safetensors_dcp (the last two need a sharded run).")
    checkpoint_keep: int = doc(0, "Keep only the newest K checkpoints (0 keeps all).")
    checkpoint_async: bool = doc(False, "Save DCP checkpoints in the background (dcp formats only).")
    resume: bool = doc(False, "Resume from --config_path's checkpoint (a request of this command: never read from a file).")
    config_path: Path | None = doc(None, "A train_config.json used as the base for these flags.")
    dry_run: bool = doc(False, "Validate, resolve the topology, print the plan and exit without training.")
    world_size: int | None = doc(None, "With --dry_run only: plan for this many processes (a run takes the launcher's count).")
    eval_freq: int = doc(0, "Roll the policy out in the demo's reaching task every N loop steps, on the main rank, as lerobot-train's "
                         "--eval_freq (0: never); the result goes into that step's metrics.jsonl record and the next checkpoint.")
    eval: EvalConfig = sub(EvalConfig, "The evaluations of --eval_freq: how many episodes, how many at once.")
    env: EvalEnvConfig = sub(EvalEnvConfig, "The environment of --eval_freq.")
    dataset: DatasetConfig = sub(DatasetConfig, "Dataset.")
    policy: PolicyConfig = sub(demo_act, "Policy, tagged by --policy.type (act, mlp, or an installed plugin's); with neither --policy.type "
                               "nor --policy.path: the demo preset of act.")
    optimizer: OptimizerConfig = sub(OptimizerConfig, "Optimizer.")
    scheduler: SchedulerConfig = sub(SchedulerConfig, "LR scheduler; steps once per loop step.")
    parallelism: ParallelismConfig = sub(ParallelismConfig, "Data-parallel degrees.")
    accelerator: AcceleratorConfig = sub(AcceleratorConfig, "Precision, accumulation, FSDP and DDP.")
    peft: PeftConfig = sub(PeftConfig, "Parameter-efficient fine-tuning.")
    trackio: TrackioConfig = sub(TrackioConfig, "trackio logging.")
    hub: HubConfig = sub(HubConfig, "Hugging Face Hub.")

    @property
    def grad_accum_steps(self) -> int:
        return self.accelerator.gradient_accumulation.steps
