"""The accelerate environment guard: refuse what reconfigures the engine, pass plain launches."""

from __future__ import annotations

import re

import pytest

from lr_config import (
    ALLOW_ENV,
    AcceleratorConfig,
    ConfigError,
    TrainConfig,
    all_flag_paths,
    apply_accelerate_env,
    check_accelerate_env,
    refused_accelerate_vars,
)

# What `accelerate launch` exports into every worker (docs/architecture.md, measured facts), with the default precision.
PLAIN_LAUNCH = {
    "ACCELERATE_MIXED_PRECISION": "no",
    "ACCELERATE_DYNAMO_BACKEND": "no",
    "ACCELERATE_DYNAMO_MODE": "default",
    "ACCELERATE_DYNAMO_USE_FULLGRAPH": "False",
    "ACCELERATE_DYNAMO_USE_DYNAMIC": "False",
    "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "False",
    "PATH": "/usr/bin",
}


def guard_error(env: dict[str, str], mixed_precision: str = "no") -> ConfigError:
    with pytest.raises(ConfigError) as err:
        check_accelerate_env(env, mixed_precision)
    return err.value


def test_plain_accelerate_launch_passes() -> None:
    assert check_accelerate_env(PLAIN_LAUNCH, "no") == []
    assert check_accelerate_env({}, "bf16") == []


@pytest.mark.parametrize("precision", ["no", "bf16", "fp16"])
def test_launcher_precision_that_agrees_passes(precision: str) -> None:
    assert check_accelerate_env({**PLAIN_LAUNCH, "ACCELERATE_MIXED_PRECISION": precision}, precision) == []
    assert check_accelerate_env({"ACCELERATE_MIXED_PRECISION": precision.upper()}, precision) == []


@pytest.mark.parametrize(
    ("name", "flag"),
    [
        ("ACCELERATE_USE_FSDP", "--parallelism.dp_shard"),
        ("ACCELERATE_USE_PARALLELISM_CONFIG", "--parallelism.dp_replicate"),
        ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "--accelerator.gradient_accumulation.steps"),
        ("FSDP_SHARDING_STRATEGY", "--parallelism.dp_shard"),
        ("FSDP_VERSION", "--parallelism.dp_shard"),
        ("FSDP_AUTO_WRAP_POLICY", "--accelerator.fsdp.wrap_modules"),
        ("FSDP_OFFLOAD_PARAMS", "--accelerator.fsdp.cpu_offload"),
        ("PARALLELISM_CONFIG_DP_SHARD_SIZE", "--parallelism.dp_shard"),
        ("PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "--parallelism.dp_replicate"),
    ],
)
def test_engine_configuring_variables_are_refused(name: str, flag: str) -> None:
    err = guard_error({**PLAIN_LAUNCH, name: "2"})
    assert len(err.problems) == 1
    line = err.problems[0]
    assert line.startswith(f"{name}='2': use --") and line.endswith(" instead")
    assert flag in line
    assert ALLOW_ENV + "=1" in str(err)


def test_a_differing_launcher_precision_is_refused() -> None:
    err = guard_error({**PLAIN_LAUNCH, "ACCELERATE_MIXED_PRECISION": "bf16"}, "no")
    assert err.problems == ["ACCELERATE_MIXED_PRECISION='bf16': use --accelerator.mixed_precision=bf16 (it is no) instead"]
    err = guard_error({"ACCELERATE_MIXED_PRECISION": "no"}, "fp16")
    assert "--accelerator.mixed_precision=no (it is fp16)" in err.problems[0]


def test_every_refused_variable_is_named_once() -> None:
    env = {
        **PLAIN_LAUNCH,
        "ACCELERATE_MIXED_PRECISION": "fp16",
        "ACCELERATE_USE_FSDP": "true",
        "FSDP_OFFLOAD_PARAMS": "true",
        "PARALLELISM_CONFIG_DP_SHARD_SIZE": "2",
    }
    err = guard_error(env, "bf16")
    names = [line.split("=")[0] for line in err.problems]
    assert names == sorted(["ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_FSDP", "FSDP_OFFLOAD_PARAMS", "PARALLELISM_CONFIG_DP_SHARD_SIZE"])
    for line in err.problems:
        assert line in str(err)
        assert "use --" in line
    assert not any(name.startswith("ACCELERATE_DYNAMO") for name in names)


def test_every_hint_names_settings_that_exist() -> None:
    """A refusal points only at flags lr has (it once said --accelerator.fsdp.* for a sharding strategy),
    or says that lr has no setting for the variable."""
    known = set(all_flag_paths())
    names = ["ACCELERATE_USE_FSDP", "ACCELERATE_USE_PARALLELISM_CONFIG", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "FSDP_SHARDING_STRATEGY",
             "FSDP_TRANSFORMER_CLS_TO_WRAP", "FSDP_AUTO_WRAP_POLICY", "FSDP_MIN_NUM_PARAMS", "FSDP_OFFLOAD_PARAMS", "FSDP_RESHARD_AFTER_FORWARD",
             "FSDP_VERSION", "FSDP_USE_ORIG_PARAMS", "PARALLELISM_CONFIG_DP_SHARD_SIZE", "PARALLELISM_CONFIG_TP_SIZE"]
    hints = refused_accelerate_vars({name: "2" for name in names} | {"ACCELERATE_MIXED_PRECISION": "bf16"}, "no")
    assert sorted(hints) == sorted([*names, "ACCELERATE_MIXED_PRECISION"])
    for name, hint in hints.items():
        flags = re.findall(r"--([a-z_.]+[a-z_])", hint)
        assert flags or hint.startswith("no lr setting"), (name, hint)
        assert all(flag in known for flag in flags), (name, hint)


def test_acknowledged_variables_continue() -> None:
    env = {**PLAIN_LAUNCH, "ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", ALLOW_ENV: "1"}
    assert check_accelerate_env(env, "no") == ["ACCELERATE_USE_FSDP", "FSDP_VERSION"]


@pytest.mark.parametrize("value", ["0", "true", "yes", ""])
def test_only_one_acknowledges(value: str) -> None:
    guard_error({"ACCELERATE_USE_FSDP": "true", ALLOW_ENV: value})


@pytest.mark.parametrize("name", ["ACCELERATE_DYNAMO_BACKEND", "ACCELERATE_USE_CPU", "MY_FSDP_THING", "CUDA_VISIBLE_DEVICES", "LOCAL_RANK"])
def test_unrelated_variables_pass(name: str) -> None:
    assert refused_accelerate_vars({name: "1"}, "no") == {}


@pytest.mark.parametrize("override", [ALLOW_ENV, "LEROBOT_ALLOW_ACCELERATE_ENV"])
def test_with_the_override_the_variables_apply_as_the_flags_they_mean(override: str) -> None:
    env = {**PLAIN_LAUNCH, override: "1", "ACCELERATE_MIXED_PRECISION": "bf16", "ACCELERATE_USE_FSDP": "true",
           "FSDP_TRANSFORMER_CLS_TO_WRAP": "ACTEncoderLayer,ACTDecoderLayer", "FSDP_OFFLOAD_PARAMS": "false", "FSDP_VERSION": "2",
           "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4"}
    cfg, lines = apply_accelerate_env(TrainConfig(), env)
    assert cfg.accelerator.mixed_precision == "bf16" and cfg.parallelism.dp_shard == -1 and cfg.grad_accum_steps == 4
    assert cfg.accelerator.fsdp.wrap_modules == ["ACTEncoderLayer", "ACTDecoderLayer"] and cfg.accelerator.fsdp.cpu_offload is False
    assert lines == [
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS=4 -> --accelerator.gradient_accumulation.steps=4",
        "ACCELERATE_MIXED_PRECISION=bf16 -> --accelerator.mixed_precision=bf16",
        "ACCELERATE_USE_FSDP=true -> --parallelism.dp_shard=-1",
        "FSDP_OFFLOAD_PARAMS=false -> --accelerator.fsdp.cpu_offload=false",
        'FSDP_TRANSFORMER_CLS_TO_WRAP=ACTEncoderLayer,ACTDecoderLayer -> --accelerator.fsdp.wrap_modules=["ACTEncoderLayer", "ACTDecoderLayer"]',
        "FSDP_VERSION=2 -> nothing to change",
    ]
    assert apply_accelerate_env(TrainConfig(), PLAIN_LAUNCH) == (TrainConfig(), [])


def test_what_lr_cannot_map_is_refused_even_with_the_override() -> None:
    env = {ALLOW_ENV: "1", "FSDP_USE_ORIG_PARAMS": "true", "FSDP_SHARDING_STRATEGY": "HYBRID_SHARD", "FSDP_VERSION": "1"}
    with pytest.raises(ConfigError) as err:
        apply_accelerate_env(TrainConfig(), env)
    assert err.value.problems == [
        "FSDP_SHARDING_STRATEGY='HYBRID_SHARD': HSDP needs its degrees: --parallelism.dp_replicate=R --parallelism.dp_shard=S",
        "FSDP_USE_ORIG_PARAMS='true': lr has no setting for it; unset it",
        "FSDP_VERSION='1': lr shards with FSDP2 only (fully_shard); FSDP1 has no equivalent here",
    ]


def test_a_variable_that_contradicts_a_flag_is_refused() -> None:
    cfg = TrainConfig(accelerator=AcceleratorConfig(mixed_precision="fp16"))
    with pytest.raises(ConfigError) as err:
        apply_accelerate_env(cfg, {ALLOW_ENV: "1", "ACCELERATE_MIXED_PRECISION": "bf16"})
    assert err.value.problems == ["ACCELERATE_MIXED_PRECISION='bf16' means --accelerator.mixed_precision=bf16, but --accelerator.mixed_precision is fp16"]
