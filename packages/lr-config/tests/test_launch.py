"""Launch commands for torchrun and accelerate launch, one node and several."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from lr_config import (
    ConfigError,
    LaunchSpec,
    build_launch,
    build_slurm_script,
    check_accelerate_env,
    parse_train_config,
)

TRAIN = ["-m", "lr_engine.cli", "train"]


def launch(spec: LaunchSpec, argv: list[str]) -> list[str]:
    return build_launch(spec, parse_train_config(argv))


def launch_error(spec: LaunchSpec, argv: list[str]) -> str:
    with pytest.raises(ConfigError) as err:
        launch(spec, argv)
    return str(err.value)


def test_torchrun_one_node() -> None:
    argv = launch(LaunchSpec(nproc_per_node=4), ["--parallelism.dp_shard=-1", "--steps=50"])
    assert argv == ["torchrun", "--standalone", "--nproc-per-node=4", *TRAIN, "--steps=50", "--parallelism.dp_shard=-1"]


def test_torchrun_one_process_with_defaults() -> None:
    assert launch(LaunchSpec(), []) == ["torchrun", "--standalone", "--nproc-per-node=1", *TRAIN]


def test_torchrun_several_nodes() -> None:
    spec = LaunchSpec(nnodes=2, node_rank=1, nproc_per_node=4, rdzv_endpoint="node0:29400", rdzv_id="job7")
    argv = launch(spec, ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=4"])
    assert argv == [
        "torchrun",
        "--nnodes=2",
        "--node-rank=1",
        "--nproc-per-node=4",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=node0:29400",
        "--rdzv-id=job7",
        *TRAIN,
        "--parallelism.dp_replicate=2",
        "--parallelism.dp_shard=4",
    ]


def test_accelerate_one_node() -> None:
    argv = launch(LaunchSpec(launcher="accelerate", nproc_per_node=2), ["--accelerator.mixed_precision=bf16"])
    assert argv == [
        "accelerate",
        "launch",
        "--multi_gpu",
        "--num_processes=2",
        "--mixed_precision=bf16",
        *TRAIN,
        "--accelerator.mixed_precision=bf16",
    ]


def test_accelerate_one_process_has_no_multi_gpu() -> None:
    argv = launch(LaunchSpec(launcher="accelerate"), [])
    assert argv == ["accelerate", "launch", "--num_processes=1", "--mixed_precision=no", *TRAIN]


def test_accelerate_several_nodes() -> None:
    spec = LaunchSpec(launcher="accelerate", nnodes=2, node_rank=0, nproc_per_node=8, rdzv_endpoint="10.0.0.1:29500")
    argv = launch(spec, ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=8"])
    assert argv == [
        "accelerate",
        "launch",
        "--multi_gpu",
        "--num_processes=16",
        "--mixed_precision=no",
        "--num_machines=2",
        "--machine_rank=0",
        "--main_process_ip=10.0.0.1",
        "--main_process_port=29500",
        *TRAIN,
        "--parallelism.dp_replicate=2",
        "--parallelism.dp_shard=8",
    ]


@pytest.mark.parametrize("precision", ["no", "bf16", "fp16"])
def test_accelerate_precision_agrees_with_the_env_guard(precision: str) -> None:
    # accelerate exports its --mixed_precision as ACCELERATE_MIXED_PRECISION into the workers.
    argv = launch(LaunchSpec(launcher="accelerate", nproc_per_node=2), [f"--accelerator.mixed_precision={precision}"])
    exported = next(a for a in argv if a.startswith("--mixed_precision=")).split("=", 1)[1]
    cfg = parse_train_config(argv[argv.index("train") + 1 :])
    assert check_accelerate_env({"ACCELERATE_MIXED_PRECISION": exported}, cfg.accelerator.mixed_precision) == []


def test_the_train_flags_rebuild_the_config() -> None:
    flags = ["--policy.type=mlp", "--policy.hidden_dim=64", '--accelerator.fsdp.wrap_modules=["Block"]', "--output_dir=/runs/a b", "--parallelism.dp_shard=-1"]
    cfg = parse_train_config(flags)
    for spec in (LaunchSpec(nproc_per_node=2), LaunchSpec(launcher="accelerate", nnodes=2, nproc_per_node=2, rdzv_endpoint="h:1")):
        argv = build_launch(spec, cfg)
        assert argv[argv.index("train") - 2 : argv.index("train") + 1] == TRAIN
        assert parse_train_config(argv[argv.index("train") + 1 :]) == cfg


@pytest.mark.parametrize(
    ("spec", "argv", "expected"),
    [
        (LaunchSpec(nproc_per_node=4), ["--parallelism.dp_shard=3"], "1 x 3 = 3, but 4 processes will run"),
        (LaunchSpec(nproc_per_node=3), ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=-1"], "3 processes are not divisible by --parallelism.dp_replicate=2"),
        (LaunchSpec(nnodes=2, nproc_per_node=2, rdzv_endpoint="h:1"), ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=4"], "2 x 4 = 8, but 4 processes will run"),
        (LaunchSpec(nproc_per_node=2), ["--steps=0"], "--steps: must be >= 1, got 0"),
    ],
)
def test_the_builder_refuses_what_would_fail_at_start_up(spec: LaunchSpec, argv: list[str], expected: str) -> None:
    assert expected in launch_error(spec, argv)
    assert expected in launch_error(LaunchSpec(**{**spec.__dict__, "launcher": "accelerate"}), argv)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (LaunchSpec(nnodes=0), "nnodes: must be >= 1, got 0"),
        (LaunchSpec(nproc_per_node=0), "nproc_per_node: must be >= 1, got 0"),
        (LaunchSpec(nnodes=2, node_rank=2, rdzv_endpoint="h:1"), "node_rank: must be in [0, 1] for 2 nodes, got 2"),
        (LaunchSpec(nnodes=2), "rdzv_endpoint: required with more than one node"),
        (LaunchSpec(nnodes=2, rdzv_endpoint="node0"), "rdzv_endpoint: expected HOST:PORT, got 'node0'"),
        (LaunchSpec(nnodes=2, rdzv_endpoint="node0:http"), "rdzv_endpoint: expected HOST:PORT, got 'node0:http'"),
        (LaunchSpec(nnodes=2, rdzv_endpoint="node0:70000"), "rdzv_endpoint: expected HOST:PORT, got 'node0:70000'"),
    ],
)
def test_launcher_settings_are_checked(spec: LaunchSpec, expected: str) -> None:
    assert launch_error(spec, []).startswith(expected)


def test_slurm_script(tmp_path: Path) -> None:
    spec = LaunchSpec(nnodes=2, nproc_per_node=4, rdzv_endpoint="unused:29501", partition="gpu")
    cfg = parse_train_config([f"--output_dir={tmp_path}/run", "--parallelism.dp_replicate=2", "--parallelism.dp_shard=4"])
    script = build_slurm_script(spec, cfg)
    assert script.startswith("#!/bin/bash\n")
    for line in ("#SBATCH --nodes=2", "#SBATCH --gpus-per-node=4", "#SBATCH --partition=gpu", f"#SBATCH --output={tmp_path}/run/logs/slurm-%j.out"):
        assert line in script.splitlines()
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert "torchrun --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d" in srun
    assert srun.endswith(f"-m lr_engine.cli train --output_dir={tmp_path}/run --parallelism.dp_replicate=2 --parallelism.dp_shard=4")
    assert 'export LR_RDZV_ENDPOINT="$head_node:29501"' in script
    subprocess.run(["bash", "-n"], input=script.encode(), check=True)


def test_slurm_script_refusals(tmp_path: Path) -> None:
    cfg = parse_train_config([f"--output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match="^launcher: "):
        build_slurm_script(LaunchSpec(launcher="accelerate"), cfg)
    with pytest.raises(ConfigError, match="^--output_dir: required"):
        build_slurm_script(LaunchSpec(), parse_train_config([]))
    with pytest.raises(ConfigError, match="1 x 3 = 3, but 2 processes"):
        build_slurm_script(LaunchSpec(nnodes=2, rdzv_endpoint="h:1"), parse_train_config([f"--output_dir={tmp_path}", "--parallelism.dp_shard=3"]))


@pytest.mark.parametrize(
    ("argv", "flag", "value"),
    [
        (["--output_dir=/runs/a b"], "--output_dir", "/runs/a b"),
        (["--output_dir=runs/exp#3"], "--output_dir", "runs/exp#3"),
        (["--output_dir=/runs/a\u00a0b"], "--output_dir", "/runs/a\u00a0b"),
        (["--output_dir=/runs/a", "--job_name=my run"], "--job_name", "my run"),
        (["--output_dir=/runs/a", "--job_name=run#2"], "--job_name", "run#2"),
    ],
)
def test_slurm_script_refuses_what_an_sbatch_directive_would_cut(argv: list[str], flag: str, value: str) -> None:
    """sbatch ends an #SBATCH value at a space or '#' (no shell quoting there): the logs would
    go to '/runs/a', the job be named 'my'. Refused, naming the flag and why."""
    with pytest.raises(ConfigError) as err:
        build_slurm_script(LaunchSpec(), parse_train_config(argv))
    assert str(err.value) == (
        f"{flag}: {value!r} holds a space or '#', which a Slurm #SBATCH directive cannot hold "
        f"(sbatch would cut the value there); pass a {flag} without them"
    )


def test_slurm_script_refuses_a_partition_or_time_with_a_space() -> None:
    cfg = parse_train_config(["--output_dir=/runs/a"])
    with pytest.raises(ConfigError, match="^partition: 'gpu a' holds a space or '#'"):
        build_slurm_script(LaunchSpec(partition="gpu a"), cfg)
    with pytest.raises(ConfigError, match="^time: '1:00:00 #x' holds a space or '#'"):
        build_slurm_script(LaunchSpec(time="1:00:00 #x"), cfg)


def test_slurm_script_still_refuses_a_line_break(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="^--output_dir: .* holds a line break or control character"):
        build_slurm_script(LaunchSpec(), parse_train_config(["--output_dir=/runs/a\n#SBATCH --x"]))
