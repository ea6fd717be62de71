"""Validation rules: each bad setting is refused with a message that names the flag to change."""

from __future__ import annotations

import pytest

from lr_config import ACTConfig, ConfigError, TrainConfig, check_repo_id, parse_train_config, policy_config_dict, save_json, to_dict, validate


def problems(argv: list[str], world_size: int | None = None, nnodes: int = 1) -> list[str]:
    """The problem lines validate() reports for these flags ([] when valid)."""
    cfg = parse_train_config(argv)
    try:
        validate(cfg, world_size=world_size, nnodes=nnodes)
    except ConfigError as err:
        assert err.problems, "a ConfigError must list its problems"
        assert all(line in str(err) for line in err.problems)
        return err.problems
    return []


def only_problem(argv: list[str], world_size: int | None = None) -> str:
    found = problems(argv, world_size)
    assert len(found) == 1, found
    return found[0]


def test_defaults_are_valid_for_every_world_size() -> None:
    for world in range(1, 9):
        assert validate(TrainConfig(), world_size=world) is not None
    assert validate(TrainConfig()) is None


@pytest.mark.parametrize("flag", ["dp_replicate", "dp_shard"])
@pytest.mark.parametrize("value", [0, -2])
@pytest.mark.parametrize("world_size", [None, 4])
def test_zero_or_negative_degree_names_the_flag(flag: str, value: int, world_size: int | None) -> None:
    line = only_problem([f"--parallelism.{flag}={value}"], world_size)
    assert line.startswith(f"--parallelism.{flag}: must be >= 1")
    assert f"got {value}" in line


def test_dp_replicate_minus_one_is_not_an_inference_request() -> None:
    line = only_problem(["--parallelism.dp_replicate=-1"], 4)
    assert line == "--parallelism.dp_replicate: must be >= 1, got -1"


def test_dp_shard_infer_that_does_not_divide_the_world() -> None:
    line = only_problem(["--parallelism.dp_shard=-1", "--parallelism.dp_replicate=3"], 4)
    assert line.startswith("--parallelism.dp_shard=-1: cannot infer the shard degree")
    assert "4 processes" in line and "--parallelism.dp_replicate=3" in line


def test_degree_product_mismatch_gives_the_numbers() -> None:
    line = only_problem(["--parallelism.dp_replicate=3", "--parallelism.dp_shard=2"], 4)
    assert "--parallelism.dp_replicate x --parallelism.dp_shard = 3 x 2 = 6" in line
    assert "but 4 processes will run" in line
    # the suggested fix must work: dp_shard=-1 cannot (4 is not divisible by 3)
    assert "--parallelism.dp_replicate=1 --parallelism.dp_shard=4" in line
    line = only_problem(["--parallelism.dp_replicate=2", "--parallelism.dp_shard=1"], 4)
    assert "--parallelism.dp_shard=-1" in line  # here it does: 2 x 2 = 4


@pytest.mark.parametrize("fmt", ["dcp", "safetensors_dcp"])
@pytest.mark.parametrize(("argv", "world"), [([], 1), ([], 4), (["--parallelism.dp_replicate=2", "--parallelism.dp_shard=1"], 2)])
def test_sharded_checkpoint_formats_are_accepted_on_an_unsharded_run(fmt: str, argv: list[str], world: int) -> None:
    """The guide's rule: such a run simply writes model.safetensors (the engine says so once)."""
    assert problems([f"--checkpoint_format={fmt}", *argv], world) == []


@pytest.mark.parametrize("fmt", ["dcp", "safetensors_dcp"])
def test_sharded_checkpoint_format_on_sharded_runs(fmt: str) -> None:
    assert problems([f"--checkpoint_format={fmt}", "--parallelism.dp_shard=-1"], 2) == []
    hsdp = ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2", f"--checkpoint_format={fmt}"]
    assert problems(hsdp, 4) == []


@pytest.mark.parametrize(
    ("flag", "shown", "back"),
    [
        ('--accelerator.fsdp.wrap_modules=["ACTEncoderLayer"]', '--accelerator.fsdp.wrap_modules=["ACTEncoderLayer"]', "--accelerator.fsdp.wrap_modules=null"),
        ("--accelerator.fsdp.cpu_offload=true", "--accelerator.fsdp.cpu_offload=true", "--accelerator.fsdp.cpu_offload=false"),
        ("--accelerator.fsdp.reshard_after_forward=false", "--accelerator.fsdp.reshard_after_forward=false", "--accelerator.fsdp.reshard_after_forward=true"),
        ("--accelerator.fsdp.mixed_precision_policy.param_dtype=bfloat16", '--accelerator.fsdp.mixed_precision_policy.param_dtype="bfloat16"',
         "--accelerator.fsdp.mixed_precision_policy.param_dtype=null"),
    ],
)
@pytest.mark.parametrize(("argv", "world"), [([], 1), ([], 4), (["--parallelism.dp_replicate=2", "--parallelism.dp_shard=1"], 2)])
def test_fsdp_settings_need_a_sharded_run(flag: str, shown: str, back: str, argv: list[str], world: int) -> None:
    """accelerate trains plain DDP when its FSDP settings meet an unsharded run; lr says so instead,
    with the flags that put them back (a resume of a sharded run onto one process may need them)."""
    line = only_problem([flag, *argv], world)
    assert line.startswith(f"--accelerator.fsdp: {shown} only apply to a sharded run, and this run is ")
    assert line.endswith(f"shard it (--parallelism.dp_shard=-1 or N), or set them back ({back})")
    assert problems([flag, "--parallelism.dp_shard=-1"], 2) == []
    assert problems([flag, "--parallelism.dp_replicate=2", "--parallelism.dp_shard=2"], 4) == []


def test_wrap_modules_and_min_num_params_are_exclusive() -> None:
    line = only_problem(['--accelerator.fsdp.wrap_modules=["Block"]', "--accelerator.fsdp.min_num_params=1000"])
    assert "--accelerator.fsdp.wrap_modules" in line and "--accelerator.fsdp.min_num_params" in line
    assert "exclusive" in line


def test_empty_wrap_modules_and_small_min_num_params() -> None:
    assert only_problem(["--accelerator.fsdp.wrap_modules=[]"]).startswith("--accelerator.fsdp.wrap_modules: empty list")
    assert only_problem(["--accelerator.fsdp.min_num_params=0"]) == "--accelerator.fsdp.min_num_params: must be >= 1, got 0"


@pytest.mark.parametrize("name", ["param_dtype", "reduce_dtype", "output_dtype"])
@pytest.mark.parametrize("precision", ["no", "bf16"])
def test_float16_dtype_needs_fp16_mixed_precision(name: str, precision: str) -> None:
    flag = f"--accelerator.fsdp.mixed_precision_policy.{name}=float16"
    line = only_problem([flag, f"--accelerator.mixed_precision={precision}"])
    assert line.startswith(flag + " needs --accelerator.mixed_precision=fp16")
    assert problems([flag, "--accelerator.mixed_precision=fp16"]) == []


def test_bfloat16_dtype_needs_no_particular_mode() -> None:
    assert problems(["--accelerator.fsdp.mixed_precision_policy.param_dtype=bfloat16"]) == []


def test_policy_dtype_takes_float32_or_bfloat16_and_no_fp16_autocast_over_it(tmp_path) -> None:
    assert problems(["--policy.dtype=bfloat16"]) == [] and problems(["--policy.dtype=bfloat16", "--accelerator.mixed_precision=bf16"]) == []
    with pytest.raises(ConfigError, match=r"--policy\.dtype: expected one of 'float32', 'bfloat16', got 'float16'"):
        parse_train_config(["--policy.dtype=float16"])
    line = only_problem(["--policy.dtype=bfloat16", "--accelerator.mixed_precision=fp16"])
    assert line.startswith("--policy.dtype=bfloat16 with --accelerator.mixed_precision=fp16") and "bf16 or no" in line
    save_json(tmp_path / "config.json", policy_config_dict(ACTConfig()))
    lora = [f"--policy.path={tmp_path}", "--policy.dtype=bfloat16", "--peft.method_type=LORA"]
    assert only_problem(lora).endswith("needs --accelerator.mixed_precision=bf16 (or --policy.dtype=float32)")
    assert problems([*lora, "--accelerator.mixed_precision=bf16"]) == []


@pytest.mark.parametrize("name", ["ring_degree", "ulysses_degree"])
@pytest.mark.parametrize("value", [2, 8])
@pytest.mark.parametrize("world_size", [None, 1, 4])
def test_context_parallel_above_one_is_refused(name: str, value: int, world_size: int | None) -> None:
    line = only_problem([f"--parallelism.context_parallel.{name}={value}"], world_size)
    assert line.startswith(f"--parallelism.context_parallel.{name}:")
    assert f"must be 1, got {value}" in line


def test_unknown_policy_type_suggests_the_closest() -> None:
    with pytest.raises(ConfigError) as err:
        parse_train_config(["--policy.type=mpl"])
    assert str(err.value).startswith("--policy.type: unknown policy type 'mpl'")
    assert "did you mean 'mlp'?" in str(err.value)
    assert "known types: act, mlp" in str(err.value)  # then the installed plugins


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--steps=0"], "--steps: must be >= 1, got 0"),
        (["--batch_size=-3"], "--batch_size: must be >= 1, got -3"),
        (["--log_freq=0"], "--log_freq: must be >= 1, got 0"),
        (["--save_freq=0"], "--save_freq: must be >= 1, got 0"),
        (["--num_workers=-1"], "--num_workers: must be >= 0, got -1"),
        (["--checkpoint_keep=-1"], "--checkpoint_keep: must be >= 0, got -1"),
        (["--accelerator.gradient_accumulation.steps=0"], "--accelerator.gradient_accumulation.steps: must be >= 1, got 0"),
        (["--accelerator.gradient_accumulation.steps=4", "--steps=3", "--save_checkpoint=false"],
         "--steps: must be >= --accelerator.gradient_accumulation.steps (4) for one optimizer update to happen, got 3"),
        (["--optimizer.lr=0"], "--optimizer.lr: must be > 0, got 0.0"),
        (["--optimizer.grad_clip_norm=-1"], "--optimizer.grad_clip_norm: must be >= 0, got -1.0"),
        (["--optimizer.betas=[0.9]"], "--optimizer.betas: expected two values in [0, 1), got [0.9]"),
        (["--optimizer.betas=[0.9, 1.0]"], "--optimizer.betas: expected two values in [0, 1), got [0.9, 1.0]"),
        (["--scheduler.warmup_steps=-1"], "--scheduler.warmup_steps: must be >= 0, got -1"),
        (["--scheduler.min_lr_ratio=1.5"], "--scheduler.min_lr_ratio: must be in [0, 1], got 1.5"),
        (["--dataset.episodes=[1, 1]"], "--dataset.episodes: expected distinct episode indices >= 0, got [1, 1]"),
        (["--dataset.episodes=[-1]"], "--dataset.episodes: expected distinct episode indices >= 0, got [-1]"),
        (["--world_size=0"], "--world_size: must be >= 1, got 0"),
        (["--world_size=4"],
         "--world_size: only plans a --dry_run=true (a run takes its process count from the launcher: torchrun --nproc-per-node=4); "
         "add --dry_run=true or drop --world_size"),
        (["--optimizer.weight_decay=-0.1"], "--optimizer.weight_decay: must be >= 0, got -0.1"),
        (["--optimizer.eps=0"], "--optimizer.eps: must be > 0, got 0.0"),
        (["--version=6"], "--version: train_config schema version 6 is not supported (expected 5)"),
    ],
)
def test_scalar_rules(argv: list[str], expected: str) -> None:
    assert only_problem(argv) == expected


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--policy.n_action_steps=11"], "--policy.n_action_steps: must be <= --policy.chunk_size (10), got 11"),
        (["--policy.type=mlp", "--policy.n_action_steps=2"], "--policy.n_action_steps: must be <= --policy.chunk_size (1), got 2"),
        (["--policy.dim_model=130"], "--policy.dim_model: must be divisible by --policy.n_heads (4), got 130"),
        (["--policy.chunk_size=0", "--policy.n_action_steps=0"], "--policy.chunk_size: must be >= 1, got 0"),
        (["--policy.dropout=1.0"], "--policy.dropout: must be in [0, 1), got 1.0"),
        (["--policy.vision_backbone=resnet81"], "--policy.vision_backbone: expected one of resnet18, resnet34, resnet50, got 'resnet81' (did you mean 'resnet18' or 'resnet50' or 'resnet34'?)"),
        (["--policy.type=act", "--policy.vision_backbone=resnet34"], "--policy.pretrained_backbone_weights: resnet34 takes ResNet34_Weights.IMAGENET1K_V1 (or null: from scratch), got 'ResNet18_Weights.IMAGENET1K_V1'"),
        (["--policy.temporal_ensemble_coeff=0.01"], "--policy.temporal_ensemble_coeff: needs --policy.n_action_steps=1 (a chunk every step), got 10"),
        (["--policy.n_obs_steps=2"], "--policy.n_obs_steps: ACT takes one observation step (1), got 2"),
        (["--policy.replace_final_stride_with_dilation=true"],
         "--policy.replace_final_stride_with_dilation: resnet18's blocks cannot dilate (as in torchvision); use --policy.vision_backbone=resnet50 or leave it false"),
        (["--policy.n_heads=0"], "--policy.n_heads: must be >= 1, got 0"),
        (["--policy.type=mlp", "--policy.hidden_dim=0"], "--policy.hidden_dim: must be >= 1, got 0"),
        (["--policy.type=mlp", "--policy.n_layers=0"], "--policy.n_layers: must be >= 1, got 0"),
        (["--policy.device=gpu"], "--policy.device: unknown device kind 'gpu' (did you mean 'cuda'? an NVIDIA or AMD GPU is cuda); known kinds: cpu, cuda, mps, xpu"),
        (["--policy.device=cdua"], "--policy.device: unknown device kind 'cdua' (did you mean 'cuda'?); known kinds: cpu, cuda, mps, xpu"),
        (["--policy.device=cuda:first"], "--policy.device: 'cuda:first' is not a device: expected cuda or cuda:<index>"),
    ],
)
def test_policy_rules(argv: list[str], expected: str) -> None:
    assert expected in problems(argv)


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1", "mps", "xpu:0"])
def test_device_kinds_pass_whatever_this_machine_has(device: str) -> None:
    """Whether the machine has the device is the engine's check: a plan may be made elsewhere."""
    assert problems([f"--policy.device={device}"]) == []


def test_resume_needs_config_path() -> None:
    line = only_problem(["--resume=true"])
    assert line.startswith("--resume=true needs --config_path=")


def test_push_to_hub_without_a_repo_id_is_no_error() -> None:
    """As in LeRobot, push_to_hub defaults to true and a repo id says where; without one nothing is
    pushed (the engine says so in its banner), so the demo needs no flag."""
    assert problems([]) == [] and problems(["--policy.push_to_hub=true"]) == []
    assert problems(["--policy.repo_id=me/act_reach"]) == []


@pytest.mark.parametrize("bad", ["noslash", "a/b/c", "/name", "user/", "us..er/x", "user/x--y", "user/name.", "user/name.git", "a/" + "n" * 97, "-user/x", "user/na me"])
def test_bad_repo_ids_are_refused(bad: str) -> None:
    line = only_problem([f"--policy.repo_id={bad}"])
    assert line.startswith(f"--policy.repo_id: {bad!r} is not a valid Hub repo id")
    with pytest.raises(ConfigError, match="^--repo_id: "):
        check_repo_id(bad, flag="--repo_id")


@pytest.mark.parametrize("good", ["user/name", "lr/demo_reach2d", "A1/b.c-d_e", "u/" + "n" * 96])
def test_good_repo_ids_pass(good: str) -> None:
    assert check_repo_id(good) == good


def test_checkpoint_async_needs_a_dcp_format() -> None:
    line = only_problem(["--checkpoint_async=true"])
    assert line.startswith("--checkpoint_async=true needs --checkpoint_format=dcp or safetensors_dcp")
    assert problems(["--checkpoint_async=true", "--checkpoint_format=dcp", "--parallelism.dp_shard=-1"], 2) == []


def test_peft_needs_policy_path(tmp_path) -> None:
    line = only_problem(["--peft.method_type=LORA"])
    assert line.startswith("--peft.method_type=LORA needs --policy.path=")
    save_json(tmp_path / "config.json", policy_config_dict(ACTConfig()))
    assert problems(["--peft.method_type=LORA", f"--policy.path={tmp_path}"]) == []
    assert "--peft.r: must be >= 1, got 0" in problems(["--peft.method_type=LORA", f"--policy.path={tmp_path}", "--peft.r=0"])
    assert only_problem(["--peft.lora_dropout=1.5"]) == "--peft.lora_dropout: must be in [0, 1), got 1.5"


def test_bad_regex_names_the_flag() -> None:
    line = only_problem(["--accelerator.fsdp.ignored_modules=.*lora_(A"])
    assert line.startswith("--accelerator.fsdp.ignored_modules: not a valid regex")
    assert problems(["--accelerator.fsdp.ignored_modules=.*lora_[AB]"]) == []


@pytest.mark.parametrize("flag", ["optimizer.lr", "optimizer.grad_clip_norm", "optimizer.weight_decay", "policy.kl_weight", "scheduler.min_lr_ratio"])
@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_are_refused(flag: str, value: str) -> None:
    # JSON decodes these, and NaN slips through every `<` comparison.
    found = problems([f"--{flag}={value}"])
    assert any(line.startswith(f"--{flag}: must be a finite number") for line in found), found


def test_every_problem_is_reported_at_once() -> None:
    found = problems(["--steps=0", "--batch_size=0", "--resume=true", "--parallelism.dp_shard=3"], 4)
    assert len(found) == 4
    assert [line.split()[0].split(":")[0].split("=")[0] for line in found] == [
        "--steps",
        "--batch_size",
        "--resume",
        "--parallelism.dp_replicate",
    ]
    with pytest.raises(ConfigError, match=r"^4 problems in the settings:\n  --steps"):
        validate(parse_train_config(["--steps=0", "--batch_size=0", "--resume=true", "--parallelism.dp_shard=3"]), world_size=4)


def test_validate_returns_the_resolved_topology() -> None:
    topo = validate(parse_train_config(["--parallelism.dp_shard=-1"]), world_size=4)
    assert topo is not None and topo.layout == "fsdp2" and topo.dp_shard == 4


def test_fsdp_settings_a_sharded_runs_file_holds_pass_on_a_resume_onto_one_process(tmp_path) -> None:
    """A resume onto another layout asks for it with both degrees; the checkpoint's own FSDP
    settings stay in its config (for a later sharded resume), while one typed now is refused."""
    run = tmp_path / "run"
    step = run / "checkpoints" / "000004" / "pretrained_model"
    saved = parse_train_config(["--parallelism.dp_shard=2", '--accelerator.fsdp.wrap_modules=["ACTEncoderLayer"]', f"--output_dir={run}"])
    save_json(step / "train_config.json", to_dict(saved))
    single = ["--resume=true", f"--config_path={step.parent}", "--parallelism.dp_replicate=1", "--parallelism.dp_shard=1"]
    assert validate(parse_train_config(single), world_size=1) is not None
    with pytest.raises(ConfigError, match=r"--accelerator.fsdp.cpu_offload=true only apply to a sharded run.*set them back \(--accelerator.fsdp.cpu_offload=false\)"):
        validate(parse_train_config([*single, "--accelerator.fsdp.cpu_offload=true"]), world_size=1)
