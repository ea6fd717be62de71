"""lr-config: the contract of lr.

Typed, versioned dataclasses for every setting and file, the `--a.b=value` flag parser,
validation with errors that name the flag, topology and batch arithmetic, the accelerate
environment guard, and launch-command building. Pure Python: importing it never imports
torch.

    >>> from lr_config import parse_train_config, validate
    >>> cfg = parse_train_config(["--parallelism.dp_shard=-1", "--batch_size=4"])
    >>> topo = validate(cfg, world_size=2)
    >>> topo.layout
    'fsdp2'
"""

from ._configs import (
    CHECKPOINT_FORMATS,
    DEMO_REPO_ID,
    POLICY_TYPES,
    TRAIN_CONFIG_VERSION,
    ACTConfig,
    AcceleratorConfig,
    ContextParallelConfig,
    DatasetConfig,
    DDPConfig,
    FeatureSpec,
    FSDPConfig,
    GradientAccumulationConfig,
    HubConfig,
    MixedPrecisionPolicyConfig,
    MLPConfig,
    OptimizerConfig,
    ParallelismConfig,
    PeftConfig,
    PolicyConfig,
    PolicyConfigBase,
    SchedulerConfig,
    TrackioConfig,
    TrainConfig,
)
from ._env_guard import ALLOW_ENV, check_accelerate_env, refused_accelerate_vars
from ._errors import ConfigError, did_you_mean
from ._files import (
    CHECKSUMS_VERSION,
    FILES_VERSION,
    Checksums,
    FileDigest,
    MetricsRecord,
    TRAINING_STEP_VERSION,
    RunStatus,
    TrainingStep,
    holds_a_run,
    load_checksums,
    load_run_status,
    load_training_step,
    parse_metrics_line,
    read_metrics,
    save_checksums,
    save_run_status,
    save_training_step,
)
from ._flags import all_flag_paths, format_help, parse_train_config, split_flags
from ._policy_file import POLICY_CONFIG_VERSION, load_policy_config, policy_config_dict
from ._launch import LaunchSpec, build_launch, build_slurm_script, config_to_flags, format_command
from ._resume import build_resume_launch, resume_config, resume_config_path, resume_is_sample_exact, resume_problems
from ._serde import from_dict, load_json, make_converter, save_json, to_dict
from ._topology import Topology, banner_line, effective_batch, resolve_topology
from ._validate import DEVICE_KINDS, check_repo_id, device_problem, validate

__all__ = [
    "ALLOW_ENV",
    "CHECKPOINT_FORMATS",
    "DEMO_REPO_ID",
    "DEVICE_KINDS",
    "CHECKSUMS_VERSION",
    "FILES_VERSION",
    "POLICY_CONFIG_VERSION",
    "POLICY_TYPES",
    "TRAIN_CONFIG_VERSION",
    "TRAINING_STEP_VERSION",
    "ACTConfig",
    "AcceleratorConfig",
    "Checksums",
    "ConfigError",
    "ContextParallelConfig",
    "DDPConfig",
    "DatasetConfig",
    "FSDPConfig",
    "FeatureSpec",
    "FileDigest",
    "GradientAccumulationConfig",
    "HubConfig",
    "LaunchSpec",
    "MLPConfig",
    "MetricsRecord",
    "MixedPrecisionPolicyConfig",
    "OptimizerConfig",
    "ParallelismConfig",
    "PeftConfig",
    "PolicyConfig",
    "PolicyConfigBase",
    "RunStatus",
    "SchedulerConfig",
    "Topology",
    "TrackioConfig",
    "TrainConfig",
    "TrainingStep",
    "all_flag_paths",
    "banner_line",
    "build_launch",
    "build_resume_launch",
    "build_slurm_script",
    "check_accelerate_env",
    "check_repo_id",
    "config_to_flags",
    "did_you_mean",
    "device_problem",
    "effective_batch",
    "format_command",
    "format_help",
    "from_dict",
    "holds_a_run",
    "load_checksums",
    "load_policy_config",
    "load_json",
    "load_run_status",
    "load_training_step",
    "make_converter",
    "parse_train_config",
    "policy_config_dict",
    "parse_metrics_line",
    "read_metrics",
    "refused_accelerate_vars",
    "resolve_topology",
    "resume_config",
    "resume_config_path",
    "resume_is_sample_exact",
    "resume_problems",
    "save_checksums",
    "save_json",
    "save_run_status",
    "save_training_step",
    "split_flags",
    "to_dict",
    "validate",
]
