"""Round trips over generated valid configs (hypothesis), for both policy types.

- TrainConfig -> to_dict -> JSON -> from_dict is lossless, and the dict holds every field;
  a config file saved by one config is the --config_path base of another;
- parse_train_config(config_to_flags(cfg)) == cfg, from the defaults and over --config_path;
- format_command renders argv that a shell splits back to the same argv.

Strings avoid "null" and "None": as flag values those mean unset (see flags.py).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lr_config import (
    BACKBONE_WEIGHTS,
    ACTConfig,
    ConfigError,
    FeatureSpec,
    LaunchSpec,
    MLPConfig,
    PolicyConfigBase,
    TrainConfig,
    build_launch,
    config_to_flags,
    format_command,
    from_dict,
    TRAIN_CONFIG_VERSION,
    load_train_config,
    parse_train_config,
    policy_config_dict,
    save_json,
    to_dict,
    validate,
)
from lr_config import (
    AcceleratorConfig,
    DatasetConfig,
    DDPConfig,
    FSDPConfig,
    GradientAccumulationConfig,
    HubConfig,
    MixedPrecisionPolicyConfig,
    OptimizerConfig,
    ParallelismConfig,
    PeftConfig,
    SchedulerConfig,
    TrackioConfig,
)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

text = st.text(st.characters(exclude_categories=["Cs"]), max_size=12).filter(lambda s: s not in ("null", "None"))
names = st.text("abcdefghijklmnopqrstuvwxyz_.", min_size=1, max_size=10).filter(lambda s: s not in ("null", "None"))
paths = st.builds(Path, text.filter(lambda s: "\x00" not in s))
opt = st.none().__or__
pos = st.integers(min_value=1, max_value=10_000)
nonneg = st.integers(min_value=0, max_value=10_000)
unit = st.floats(min_value=0, max_value=1, exclude_max=True)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
dtypes = st.sampled_from(["float32", "bfloat16", "float16"])
repo_ids = st.from_regex(r"\A[a-z0-9][a-z0-9_]{0,8}/[a-z0-9][a-z0-9_]{0,8}\Z")
features = st.dictionaries(
    st.sampled_from(["observation.state", "observation.environment_state", "observation.images.top", "action"]),
    st.builds(FeatureSpec, type=st.sampled_from(["STATE", "ENV", "VISUAL", "ACTION"]), shape=st.lists(pos, max_size=3)),
    max_size=3,
)
norm = st.dictionaries(st.sampled_from(["STATE", "ENV", "VISUAL", "ACTION"]), st.sampled_from(["mean_std", "min_max", "identity"]))


@st.composite
def policy_common(draw: st.DrawFn) -> dict[str, Any]:
    repo_id = draw(opt(repo_ids))
    return {
        "device": draw(opt(st.sampled_from(["cpu", "cuda", "cuda:1", "mps", "xpu:0", ""]))),
        "path": draw(opt(paths)),
        "repo_id": repo_id,
        "push_to_hub": repo_id is not None and draw(st.booleans()),
        "private": draw(st.booleans()),
        "license": draw(text),
        "input_features": draw(opt(features)),
        "output_features": draw(opt(features)),
        "normalization_mapping": draw(norm),
    }


@st.composite
def act_configs(draw: st.DrawFn) -> ACTConfig:
    chunk = draw(st.integers(1, 100))
    heads = draw(st.integers(1, 8))
    steps = draw(st.integers(1, chunk))
    backbone = draw(st.sampled_from(sorted(BACKBONE_WEIGHTS)))
    return ACTConfig(
        **draw(policy_common()),
        chunk_size=chunk,
        n_action_steps=steps,
        dim_model=heads * draw(st.integers(1, 64)),
        n_heads=heads,
        dim_feedforward=draw(pos),
        n_encoder_layers=draw(st.integers(1, 8)),
        n_decoder_layers=draw(st.integers(1, 8)),
        use_vae=draw(st.booleans()),
        latent_dim=draw(pos),
        n_vae_encoder_layers=draw(st.integers(1, 8)),
        kl_weight=draw(finite),
        dropout=draw(unit),
        vision_backbone=backbone,
        pretrained_backbone_weights=draw(st.none() | st.sampled_from(BACKBONE_WEIGHTS[backbone])),
        pre_norm=draw(st.booleans()),
        feedforward_activation=draw(st.sampled_from(["relu", "gelu", "glu"])),
        temporal_ensemble_coeff=draw(st.none() | finite) if steps == 1 else None,
        optimizer_lr=draw(finite),
    )


@st.composite
def mlp_configs(draw: st.DrawFn) -> MLPConfig:
    chunk = draw(st.integers(1, 100))
    return MLPConfig(
        **draw(policy_common()),
        chunk_size=chunk,
        n_action_steps=draw(st.integers(1, chunk)),
        hidden_dim=draw(pos),
        n_layers=draw(st.integers(1, 16)),
        dropout=draw(unit),
    )


@st.composite
def fsdp_configs(draw: st.DrawFn, fp16: bool) -> FSDPConfig:
    unit_rule = draw(st.sampled_from(["none", "wrap", "min"]))
    dtype = dtypes if fp16 else st.sampled_from(["float32", "bfloat16"])
    return FSDPConfig(
        wrap_modules=draw(st.lists(names, min_size=1, max_size=3)) if unit_rule == "wrap" else None,
        min_num_params=draw(pos) if unit_rule == "min" else None,
        reshard_after_forward=draw(st.booleans()),
        cpu_offload=draw(st.booleans()),
        ignored_modules=draw(opt(st.sampled_from([".*lora_[AB].*", r"base_model\.model\..*head", "encoder"]))),
        mixed_precision_policy=MixedPrecisionPolicyConfig(
            param_dtype=draw(opt(dtype)),
            reduce_dtype=draw(opt(dtype)),
            output_dtype=draw(opt(dtype)),
            cast_forward_inputs=draw(opt(st.booleans())),
        ),
    )


@st.composite
def train_configs(draw: st.DrawFn, config_path: bool = True) -> TrainConfig:
    """A TrainConfig that passes validate() (without a world size)."""
    policy: PolicyConfigBase = draw(st.one_of(act_configs(), mlp_configs()))
    precision = draw(st.sampled_from(["no", "bf16", "fp16"]))
    fmt = draw(st.sampled_from(["safetensors", "dcp", "safetensors_dcp"]))
    peft_on = policy.path is not None and draw(st.booleans())
    cfg_path = draw(opt(paths)) if config_path else None
    # with accumulation, --steps >= K (validate)
    accum = draw(st.integers(1, 64))
    save_checkpoint = draw(st.booleans())
    return TrainConfig(
        output_dir=draw(opt(paths)),
        job_name=draw(opt(text)),
        seed=draw(st.integers(-(2**63), 2**63)),
        steps=draw(st.integers(accum, 10_000)),
        batch_size=draw(pos),
        num_workers=draw(st.integers(0, 16)),
        log_freq=draw(pos),
        save_freq=draw(pos),
        save_checkpoint=save_checkpoint,
        checkpoint_format=fmt,
        checkpoint_keep=draw(nonneg),
        checkpoint_async=fmt != "safetensors" and draw(st.booleans()),
        resume=cfg_path is not None and draw(st.booleans()),
        config_path=cfg_path,
        dry_run=(dry_run := draw(st.booleans())),
        world_size=draw(opt(pos)) if dry_run else None,  # --world_size plans a dry run only
        dataset=DatasetConfig(repo_id=draw(text), root=draw(opt(paths)), episodes=draw(opt(st.lists(nonneg, unique=True, max_size=5)))),
        policy=policy,  # type: ignore[arg-type]
        optimizer=OptimizerConfig(
            type=draw(st.sampled_from(["adamw", "adam", "sgd"])),
            lr=draw(st.floats(min_value=0, max_value=10, exclude_min=True)),
            weight_decay=draw(st.floats(min_value=0, max_value=1e6)),
            betas=draw(st.lists(unit, min_size=2, max_size=2)),
            eps=draw(st.floats(min_value=0, max_value=1, exclude_min=True)),
            grad_clip_norm=draw(st.floats(min_value=0, max_value=1e6)),
        ),
        scheduler=SchedulerConfig(
            type=draw(st.sampled_from(["cosine", "linear", "constant"])),
            warmup_steps=(warmup := draw(nonneg)),
            min_lr_ratio=draw(st.floats(min_value=0, max_value=1)),
            decay_steps=draw(opt(st.integers(warmup + 1, warmup + 10**6))),
        ),
        parallelism=ParallelismConfig(dp_replicate=draw(opt(st.integers(1, 64))), dp_shard=draw(opt(st.integers(-1, 64).filter(bool)))),
        accelerator=AcceleratorConfig(
            mixed_precision=precision,
            gradient_accumulation=GradientAccumulationConfig(steps=accum),
            fsdp=draw(fsdp_configs(fp16=precision == "fp16")),
            ddp=DDPConfig(*draw(st.lists(st.booleans(), min_size=3, max_size=3))),
        ),
        peft=PeftConfig(
            method_type="LORA" if peft_on else None,
            r=draw(st.integers(1, 256)),
            lora_alpha=draw(opt(st.integers(1, 512))),
            lora_dropout=draw(unit),
            target_modules=draw(opt(st.lists(names, max_size=3))),
            full_training_modules=draw(opt(st.lists(names, max_size=3))),
        ),
        trackio=TrackioConfig(enable=draw(st.booleans()), project=draw(text), run_name=draw(opt(text))),
        hub=HubConfig(endpoint=draw(opt(st.sampled_from(["http://127.0.0.1:8000", "https://huggingface.co"]))), revision=draw(opt(names))),
    )


def shell_split(command: str) -> list[str]:
    """What a POSIX shell makes of the pasted command: the line continuations between
    arguments go, while a backslash-newline inside a quoted value stays (bash does the split;
    a NUL, which no argv can hold, is not a command to paste)."""
    assume("\0" not in command)
    out = subprocess.run(["bash", "-c", "printf '%s\\0' " + command], capture_output=True, check=True).stdout
    return out.decode().split("\0")[:-1]


def expected_shape(value: Any) -> Any:
    """The key tree a saved dataclass must have: every field, recursively, plus the policy tag."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        shape = {f.name: expected_shape(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, PolicyConfigBase):
            shape["type"] = None
        return shape
    if isinstance(value, dict):
        return {k: expected_shape(v) for k, v in value.items()}
    return None


def actual_shape(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: actual_shape(v) for k, v in data.items()}
    return None


@SETTINGS
@given(cfg=train_configs())
def test_generated_configs_round_trip_through_dict_and_json(cfg: TrainConfig) -> None:
    assert validate(cfg) is None  # the strategy builds valid configs, and validate accepts them
    data = to_dict(cfg)
    assert actual_shape(data) == expected_shape(cfg)  # every field, recursively, defaults included
    assert data["version"] == TRAIN_CONFIG_VERSION
    assert data["policy"]["type"] == cfg.policy.type_name
    assert from_dict(TrainConfig, json.loads(json.dumps(data))) == cfg
    # A wrong type and an unknown key anywhere are refused, each named by its flag path.
    data["accelerator"]["gradient_accumulation"]["steps"] = str(cfg.grad_accum_steps)
    data["policy"]["chunk_sizes"] = 3
    with pytest.raises(ConfigError) as err:
        from_dict(TrainConfig, data)
    assert sorted(err.value.problems) == [
        f"--accelerator.gradient_accumulation.steps: expected int, got '{cfg.grad_accum_steps}'",
        "--policy.chunk_sizes: unknown setting (did you mean 'chunk_size'?)",
    ]


def test_save_and_load_json_round_trip(tmp_path: Path) -> None:
    cfg = parse_train_config(["--policy.type=mlp", "--output_dir=/runs/x", '--accelerator.fsdp.wrap_modules=["Block"]'])
    save_json(tmp_path / "train_config.json", to_dict(cfg))
    assert load_train_config(tmp_path / "train_config.json") == cfg


@pytest.mark.parametrize("policy", [ACTConfig(), MLPConfig()])
def test_defaults_are_written_too(policy: PolicyConfigBase) -> None:
    data = to_dict(TrainConfig(policy=policy))  # type: ignore[arg-type]
    assert actual_shape(data) == expected_shape(TrainConfig(policy=policy))  # type: ignore[arg-type]
    assert data["accelerator"]["fsdp"]["min_num_params"] is None
    assert data["output_dir"] is None


def with_a_saved_policy(cfg: TrainConfig, folder: Path, saved: PolicyConfigBase) -> TrainConfig:
    """`cfg` with its --policy.path (when set) a real folder whose config.json holds `saved`
    (or its type's defaults when `saved` is another type): the parser starts the policy from
    it, so the flags must say every setting of `cfg.policy` that differs from it."""
    if cfg.policy.path is None:
        return cfg
    saved = saved if type(saved) is type(cfg.policy) else type(cfg.policy)()
    save_json(folder / "config.json", policy_config_dict(saved))
    return dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy, path=folder))


@SETTINGS
@given(cfg=train_configs(config_path=False), launcher=st.sampled_from(["torchrun", "accelerate"]),
       saved_policy=st.one_of(act_configs(), mlp_configs()))
def test_config_to_flags_and_launch_commands_rebuild_the_config(
    tmp_path_factory: pytest.TempPathFactory, cfg: TrainConfig, launcher: str, saved_policy: PolicyConfigBase
) -> None:
    cfg = with_a_saved_policy(cfg, tmp_path_factory.mktemp("policy"), saved_policy)
    flags = config_to_flags(cfg)
    assert parse_train_config(flags) == cfg
    assert len({f.split("=")[0] for f in flags}) == len(flags)
    # The launch command carries the same flags, and its shell rendering splits back to it.
    # (2 DDP processes: no DCP format and no FSDP settings, which validate refuses for an unsharded run)
    accelerator = dataclasses.replace(cfg.accelerator, fsdp=FSDPConfig())
    cfg = dataclasses.replace(cfg, checkpoint_format="safetensors", checkpoint_async=False, parallelism=ParallelismConfig(), accelerator=accelerator)
    argv = build_launch(LaunchSpec(launcher=launcher, nproc_per_node=2), cfg)  # type: ignore[arg-type]
    assert shell_split(format_command(argv)) == argv
    assert parse_train_config(argv[argv.index("train") + 1 :]) == cfg


def test_config_to_flags_of_the_defaults_is_empty() -> None:
    assert config_to_flags(TrainConfig()) == []
    assert config_to_flags(TrainConfig(policy=MLPConfig())) == ["--policy.type=mlp"]


@settings(SETTINGS, max_examples=20)
@given(saved=train_configs(config_path=False), cfg=train_configs(config_path=False), resume=st.booleans(),
       saved_policy=st.one_of(act_configs(), mlp_configs()))
def test_config_to_flags_over_a_config_path(
    tmp_path_factory: pytest.TempPathFactory, saved: TrainConfig, cfg: TrainConfig, resume: bool, saved_policy: PolicyConfigBase
) -> None:
    # The parser starts from the file, so the flags must say what differs from the file,
    # including a setting put back to its default and a policy type put back to act.
    path = tmp_path_factory.mktemp("base") / "train_config.json"
    save_json(path, to_dict(saved))
    cfg = with_a_saved_policy(dataclasses.replace(cfg, config_path=path, resume=resume), path.parent / "policy", saved_policy)
    flags = config_to_flags(cfg)
    assert f"--config_path={path}" in flags
    assert parse_train_config(flags) == cfg


def test_config_to_flags_over_a_config_path_restores_defaults(tmp_path: Path) -> None:
    saved = parse_train_config(["--steps=1000", "--policy.type=mlp"])
    save_json(tmp_path / "train_config.json", to_dict(saved))
    cfg = parse_train_config([f"--config_path={tmp_path}", "--steps=300", "--policy.type=act", "--resume"])
    assert config_to_flags(cfg) == [f"--config_path={tmp_path / 'train_config.json'}", "--policy.type=act", "--steps=300", "--resume=true"]
    assert parse_train_config(config_to_flags(cfg)) == cfg


def test_config_to_flags_with_a_missing_config_path_names_it(tmp_path: Path) -> None:
    cfg = TrainConfig(config_path=tmp_path / "gone.json")
    with pytest.raises(ConfigError, match="^--config_path: .*gone.json does not exist"):
        config_to_flags(cfg)


# format_command: a copyable multi-line shell command.

shell_text = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF, exclude_characters="\\"), max_size=10).filter(
    lambda s: s not in ("null", "None")
)


@SETTINGS
@given(st.lists(shell_text, min_size=1, max_size=6))
def test_format_command_quotes_any_value(values: list[str]) -> None:
    argv = ["torchrun", "--standalone", "-m", "lr_engine.cli", "train", *[f"--job_name={v}" for v in values], *values]
    assert shell_split(format_command(argv)) == argv


def test_bash_reads_format_command_back_to_the_argv() -> None:
    argv = [
        "torchrun",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "lr_engine.cli",
        "train",
        '--accelerator.fsdp.wrap_modules=["Block"]',
        "--job_name=it's a $HOME `run` & more; *",
        "--output_dir=/tmp/with space/é",
        "--dataset.repo_id=",
    ]
    command = format_command(argv)
    lines = command.splitlines()
    assert lines[0] == "torchrun \\"
    assert lines[3] == "  -m lr_engine.cli train \\"
    assert [line.split("=")[0] for line in lines[4:]] == ["  '--accelerator.fsdp.wrap_modules", "  '--job_name", "  '--output_dir", "  --dataset.repo_id"]
    script = 'argv() { printf "%s\\0" "$@"; }; argv ' + command
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout
    assert out.decode().split("\0")[:-1] == argv
