"""The accelerate environment guard: refuse what reconfigures the engine, pass plain launches."""

from __future__ import annotations

import pytest

from lr_config import ALLOW_ENV, ConfigError, check_accelerate_env, refused_accelerate_vars

# What `accelerate launch` exports into every worker (FACTS.md), with the default precision.
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
        ("FSDP_SHARDING_STRATEGY", "--accelerator.fsdp."),
        ("FSDP_VERSION", "--accelerator.fsdp."),
        ("FSDP_AUTO_WRAP_POLICY", "--accelerator.fsdp."),
        ("PARALLELISM_CONFIG_DP_SHARD_SIZE", "--parallelism."),
        ("PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "--parallelism."),
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


def test_acknowledged_variables_continue() -> None:
    env = {**PLAIN_LAUNCH, "ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", ALLOW_ENV: "1"}
    assert check_accelerate_env(env, "no") == ["ACCELERATE_USE_FSDP", "FSDP_VERSION"]


@pytest.mark.parametrize("value", ["0", "true", "yes", ""])
def test_only_one_acknowledges(value: str) -> None:
    guard_error({"ACCELERATE_USE_FSDP": "true", ALLOW_ENV: value})


@pytest.mark.parametrize("name", ["ACCELERATE_DYNAMO_BACKEND", "ACCELERATE_USE_CPU", "MY_FSDP_THING", "CUDA_VISIBLE_DEVICES", "LOCAL_RANK"])
def test_unrelated_variables_pass(name: str) -> None:
    assert refused_accelerate_vars({name: "1"}, "no") == {}
