"""`--a.b.c=value` flags: decoding, merging over defaults or --config_path, errors, --help."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from lr_config import (
    policy_types,
    ACTConfig,
    ConfigError,
    FeatureSpec,
    MLPConfig,
    TrainConfig,
    all_flag_paths,
    config_to_flags,
    format_help,
    parse_train_config,
    policy_config_dict,
    save_json,
    split_flags,
    to_dict,
)


def error_of(argv: list[str]) -> str:
    with pytest.raises(ConfigError) as err:
        parse_train_config(argv)
    return str(err.value)


def test_no_flags_give_the_defaults() -> None:
    assert parse_train_config([]) == TrainConfig()


def test_split_flags() -> None:
    assert split_flags(["--a.b=1", "--c", "--d=", "--e=x=y"]) == {"a.b": "1", "c": "true", "d": "", "e": "x=y"}


def test_values_are_json_where_they_parse() -> None:
    cfg = parse_train_config(
        [
            "--steps=7",
            "--optimizer.lr=2.5e-4",
            "--optimizer.betas=[0.8, 0.95]",
            "--dataset.episodes=[0, 3]",
            '--accelerator.fsdp.wrap_modules=["Block", "Head"]',
            "--parallelism.dp_shard=-1",
        ]
    )
    assert cfg.steps == 7
    assert cfg.optimizer.lr == 2.5e-4
    assert cfg.optimizer.betas == [0.8, 0.95]
    assert cfg.dataset.episodes == [0, 3]
    assert cfg.accelerator.fsdp.wrap_modules == ["Block", "Head"]
    assert cfg.parallelism.dp_shard == -1


def test_an_int_is_accepted_for_a_float() -> None:
    cfg = parse_train_config(["--optimizer.lr=1"])
    assert cfg.optimizer.lr == 1.0 and isinstance(cfg.optimizer.lr, float)


def test_string_and_path_fields_keep_the_raw_text() -> None:
    cfg = parse_train_config(
        [
            "--job_name=123",
            "--policy.device=true",
            '--output_dir=["out"]',
            "--dataset.repo_id=1.5",
            "--accelerator.mixed_precision=bf16",
            "--accelerator.fsdp.ignored_modules=.*lora_[AB]",
            "--trackio.project=",
        ]
    )
    assert cfg.job_name == "123"
    assert cfg.policy.device == "true"
    assert cfg.output_dir == Path('["out"]')
    assert cfg.dataset.repo_id == "1.5"
    assert cfg.accelerator.mixed_precision == "bf16"
    assert cfg.accelerator.fsdp.ignored_modules == ".*lora_[AB]"
    assert cfg.trackio.project == ""


def test_null_unsets_optional_settings() -> None:
    base = parse_train_config(["--output_dir=/x", "--policy.device=cpu", "--parallelism.dp_shard=2", "--job_name=j"])
    flags = ["--output_dir=null", "--policy.device=null", "--parallelism.dp_shard=null", "--job_name=None"]
    cfg = parse_train_config(flags)
    assert (base.output_dir, base.policy.device, base.parallelism.dp_shard, base.job_name) == (Path("/x"), "cpu", 2, "j")
    assert (cfg.output_dir, cfg.policy.device, cfg.parallelism.dp_shard, cfg.job_name) == (None, None, None, None)


@pytest.mark.parametrize(("arg", "expected"), [("--resume=true", True), ("--resume=false", False), ("--resume", True)])
def test_booleans(arg: str, expected: bool) -> None:
    assert parse_train_config([arg]).resume is expected


def test_bare_flag_sets_a_nested_bool() -> None:
    cfg = parse_train_config(["--accelerator.fsdp.cpu_offload", "--save_checkpoint=false"])
    assert cfg.accelerator.fsdp.cpu_offload is True
    assert cfg.save_checkpoint is False


def test_nested_paths_change_only_their_leaf() -> None:
    cfg = parse_train_config(
        ["--accelerator.fsdp.mixed_precision_policy.param_dtype=bfloat16", "--accelerator.gradient_accumulation.steps=4"]
    )
    expected = TrainConfig()
    expected.accelerator.fsdp.mixed_precision_policy.param_dtype = "bfloat16"
    expected.accelerator.gradient_accumulation.steps = 4
    assert cfg == expected
    assert cfg.grad_accum_steps == 4


def test_a_dict_entry_can_be_set_alone() -> None:
    cfg = parse_train_config(["--policy.normalization_mapping.ACTION=min_max"])
    assert cfg.policy.normalization_mapping == {"VISUAL": "mean_std", "STATE": "mean_std", "ACTION": "min_max"}


def test_a_whole_dict_is_json() -> None:
    features = {"observation.state": {"type": "STATE", "shape": [2]}, "action": {"type": "ACTION", "shape": [2]}}
    cfg = parse_train_config([f"--policy.input_features={json.dumps(features)}"])
    assert cfg.policy.input_features is not None
    assert to_dict(cfg)["policy"]["input_features"] == features


LIST_OF_STR_FLAGS = ["peft.target_modules", "peft.full_training_modules", "accelerator.fsdp.wrap_modules"]


@pytest.mark.parametrize("flag", LIST_OF_STR_FLAGS)
def test_a_bare_string_for_a_list_is_refused_not_split_into_characters(flag: str) -> None:
    """cattrs turns any iterable into a list: 'q_proj' was ['q', '_', 'p', ...], silently."""
    message = error_of([f"--{flag}=q_proj"])
    assert f"--{flag}: expected a JSON list, got the text 'q_proj'; a list of one is --{flag}='[\"q_proj\"]'" in message.splitlines()[1:][0]
    group, leaf = flag.rsplit(".", 1)
    node: Any = parse_train_config([f"--{flag}=" + '["q_proj"]'])
    for part in group.split("."):
        node = getattr(node, part)
    assert getattr(node, leaf) == ["q_proj"]


def test_every_list_setting_takes_only_a_json_list() -> None:
    list_flags = [path for path, type_name, _, _ in _help_table() if "list[" in type_name]
    assert set(list_flags) == {*LIST_OF_STR_FLAGS, "dataset.episodes", "optimizer.betas"}
    for path in list_flags:
        for raw in ("q_proj", "16,32", '{"a": 1}', "3"):
            message = error_of([f"--{path}={raw}"])
            assert message.splitlines()[1].startswith(f"  --{path}: expected a JSON list, got"), message
    message = error_of(['--policy.input_features={"x": {"type": "STATE", "shape": "2"}}'])
    assert message.splitlines()[1] == "  --policy.input_features.x.shape: expected a JSON list, got the text '2'; write it as JSON, as in --policy.input_features.x.shape='[...]'"


def _help_table() -> list[tuple[str, str, str, str]]:
    from lr_config._flags import _leaf_docs

    return _leaf_docs(TrainConfig)


@pytest.mark.parametrize(("key", "hint"), [("STAT", "STATE"), ("action", "ACTION"), ("Visual", "VISUAL"), ("images", None)])
def test_normalization_mapping_refuses_a_key_that_is_not_a_feature_type(key: str, hint: str | None) -> None:
    """The engine looks modes up by feature type, so any other key was silently ignored."""
    message = error_of([f"--policy.normalization_mapping.{key}=min_max"])
    expected = f"  --policy.normalization_mapping.{key}: unknown key" + (f" (did you mean {hint!r}?)" if hint else "")
    assert message.splitlines()[1] == expected + "; the keys are STATE, ENV, VISUAL, ACTION"
    message = error_of(['--policy.normalization_mapping={"STATE": "identity", "' + key + '": "zscore"}'])
    assert message.splitlines()[1:] == [expected + "; the keys are STATE, ENV, VISUAL, ACTION"]  # not its value as well


def test_normalization_mapping_may_hold_fewer_feature_types() -> None:
    cfg = parse_train_config(['--policy.normalization_mapping={"ACTION": "min_max"}', "--policy.type=mlp"])
    assert cfg.policy.normalization_mapping == {"ACTION": "min_max"}


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--batch_size=1.5"], "--batch_size: expected int, got 1.5"),
        (["--resume=yes"], "--resume: expected true or false, got 'yes'"),
        (["--resume=True"], "--resume: expected true or false, got 'True'"),
        (["--steps=true"], "--steps: expected int, got True"),
        (["--steps=1e3"], "--steps: expected int, got 1000.0"),
        (["--steps="], "--steps: expected int, got ''"),
        (["--accelerator.fsdp.min_num_params=many"], "--accelerator.fsdp.min_num_params: expected int, got 'many'"),
        (["--optimizer.lr=fast"], "--optimizer.lr: expected float, got 'fast'"),
        (["--optimizer.lr=true"], "--optimizer.lr: expected float, got True"),
        (['--dataset.episodes=[1, "a"]'], "--dataset.episodes[1]: expected int, got 'a'"),
        (["--accelerator.mixed_precision=fp8"], "--accelerator.mixed_precision: expected one of 'no', 'bf16', 'fp16', got 'fp8'"),
        (["--policy.normalization_mapping.STATE=zscore"], "--policy.normalization_mapping.STATE: expected one of 'mean_std', 'min_max', 'identity', got 'zscore'"),
        (["--peft.method_type=lora"], "--peft.method_type: expected one of 'LORA', got 'lora'"),
    ],
)
def test_wrong_types_are_errors_not_casts(argv: list[str], expected: str) -> None:
    message = error_of(argv)
    assert message.startswith("invalid flags:")
    assert expected in message.splitlines()[1:] or f"  {expected}" in message.splitlines()


def test_unknown_flag_suggests_the_known_one() -> None:
    message = error_of(["--accelerator.fsdp.wrap_module=[\"Block\"]"])
    assert message.startswith("--accelerator.fsdp.wrap_module: unknown flag (did you mean '--accelerator.fsdp.wrap_modules'")
    assert "--help" in message
    assert "did you mean '--batch_size'" in error_of(["--batch_sise=3"])
    assert "did you mean '--policy.chunk_size'" in error_of(["--policy.chunk_sze=3"])


@pytest.mark.parametrize(
    ("flag", "suggested"),
    [
        ("--lr=1e-4", "'--optimizer.lr'"),  # the group left out
        ('--fsdp.wrap_modules=["Block"]', "'--accelerator.fsdp.wrap_modules'"),
        ("--accelerator.dp_shard=2", "'--parallelism.dp_shard'"),  # the name in another group
        ("--dataset.batch_size=2", "'--batch_size' or '--eval.batch_size'"),
    ],
)
def test_a_flag_in_the_wrong_group_suggests_where_it_lives(flag: str, suggested: str) -> None:
    """The suggestion once came from the first unknown name alone: '--fsdp.wrap_modules' got
    '--seed' or '--steps', and '--accelerator.dp_shard' the other fsdp settings."""
    assert error_of([flag]).startswith(f"--{flag[2:].partition('=')[0]}: unknown flag (did you mean {suggested}?)")


def test_unknown_flag_without_a_close_name() -> None:
    message = error_of(["--zzzzzz=1"])
    assert message.startswith("--zzzzzz: unknown flag")
    assert "did you mean" not in message


def test_a_value_is_not_a_group() -> None:
    assert error_of(["--steps.count=1"]) == "--steps.count: --steps is a value, not a group of settings"


@pytest.mark.parametrize("arg", ["steps=1", "-steps=1", "--", "--=1", "---steps=1", "--bad name=1", "100"])
def test_malformed_flags(arg: str) -> None:
    message = error_of([arg])
    assert message.startswith(repr(arg) + ":")
    assert "--name=value" in message


def test_repeated_flag_is_an_error() -> None:
    assert error_of(["--steps=1", "--batch_size=2", "--steps=2"]) == "--steps given twice"


def test_policy_type_swaps_the_policy_defaults() -> None:
    cfg = parse_train_config(["--policy.type=mlp"])
    assert cfg.policy == MLPConfig()
    assert to_dict(cfg)["policy"]["type"] == "mlp"
    act = parse_train_config(["--policy.type=act"])
    assert act.policy == ACTConfig()


@pytest.mark.parametrize("order", [0, 1])
def test_policy_fields_apply_after_the_type_switch_in_any_order(order: int) -> None:
    flags = ["--policy.hidden_dim=64", "--policy.type=mlp", "--policy.chunk_size=5"]
    cfg = parse_train_config(flags if order else list(reversed(flags)))
    assert cfg.policy == MLPConfig(hidden_dim=64, chunk_size=5)


def test_a_field_of_another_policy_type_is_refused() -> None:
    message = error_of(["--policy.type=mlp", "--policy.dim_model=64"])
    assert "--policy.dim_model: not a setting of --policy.type=mlp" in message


def test_config_path_is_the_base_and_flags_override_it(tmp_path: Path) -> None:
    saved = parse_train_config(["--steps=1000", "--batch_size=4", "--policy.type=mlp", "--policy.hidden_dim=32", "--seed=7"])
    save_json(tmp_path / "train_config.json", to_dict(saved))
    cfg = parse_train_config([f"--config_path={tmp_path / 'train_config.json'}", "--steps=50", "--policy.n_layers=2"])
    assert isinstance(saved.policy, MLPConfig)
    expected = dataclasses.replace(saved, steps=50, config_path=tmp_path / "train_config.json")
    expected.policy = dataclasses.replace(saved.policy, n_layers=2)
    assert cfg == expected


def test_config_path_may_name_the_folder(tmp_path: Path) -> None:
    save_json(tmp_path / "train_config.json", to_dict(parse_train_config(["--steps=9"])))
    cfg = parse_train_config([f"--config_path={tmp_path}"])
    assert cfg.steps == 9
    assert cfg.config_path == tmp_path / "train_config.json"


def test_a_resume_writes_into_the_run_folder_that_holds_the_checkpoint(tmp_path: Path) -> None:
    """The saved output_dir may be stale (a moved run) or point anywhere: a resume defaults to the run
    folder holding the checkpoint, through `last` too; an explicit --output_dir wins; a plain config
    file keeps its output_dir."""
    run = tmp_path / "moved_run"
    step = run / "checkpoints" / "000004" / "pretrained_model"
    step.mkdir(parents=True)
    (run / "checkpoints" / "last").symlink_to("000004")
    save_json(step / "train_config.json", to_dict(parse_train_config(["--output_dir=/elsewhere/old_run"])))
    for config_path in (step / "train_config.json", run / "checkpoints" / "last", run / "checkpoints" / "000004"):
        assert parse_train_config(["--resume=true", f"--config_path={config_path}"]).output_dir == run
    assert parse_train_config([f"--config_path={run / 'checkpoints' / 'last'}"]).output_dir == Path("/elsewhere/old_run")
    explicit = ["--resume=true", f"--config_path={run / 'checkpoints' / 'last'}", "--output_dir=/tmp/new_place"]
    assert parse_train_config(explicit).output_dir == Path("/tmp/new_place")
    save_json(tmp_path / "preset.json", to_dict(parse_train_config(["--output_dir=/elsewhere/old_run"])))
    assert parse_train_config(["--resume=true", f"--config_path={tmp_path / 'preset.json'}"]).output_dir == Path("/elsewhere/old_run")


def test_a_resume_from_a_relative_path_finds_the_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--config_path=last` typed inside checkpoints/ (or `.` inside a step folder) names a step of
    the run as much as the absolute path does."""
    run = tmp_path / "run"
    step = run / "checkpoints" / "000004" / "pretrained_model"
    step.mkdir(parents=True)
    (run / "checkpoints" / "last").symlink_to("000004")
    save_json(step / "train_config.json", to_dict(parse_train_config(["--output_dir=/elsewhere/old_run"])))
    for cwd, config_path in ((run / "checkpoints", "last"), (run / "checkpoints", "000004"), (step.parent, "."), (run, "checkpoints/last")):
        monkeypatch.chdir(cwd)
        assert parse_train_config(["--resume=true", f"--config_path={config_path}"]).output_dir == run, (cwd, config_path)


def test_a_resume_of_a_checkpoint_outside_a_run_needs_an_output_dir(tmp_path: Path) -> None:
    """A step folder copied out of its run (/keep/000500): the output_dir saved in it may be the
    original run, still in use; a resume must say where it writes."""
    step = tmp_path / "keep" / "000500" / "pretrained_model"
    step.mkdir(parents=True)
    save_json(step / "train_config.json", to_dict(parse_train_config([f"--output_dir={tmp_path / 'original_run'}"])))
    with pytest.raises(ConfigError, match=r"--output_dir: the checkpoint .*000500 is not inside a run's checkpoints/ folder.*pass --output_dir"):
        parse_train_config(["--resume=true", f"--config_path={step.parent}"])
    cfg = parse_train_config(["--resume=true", f"--config_path={step.parent}", f"--output_dir={tmp_path / 'new'}"])
    assert cfg.output_dir == tmp_path / "new"


def test_resume_is_asked_for_by_the_command_never_inherited_from_a_file(tmp_path: Path) -> None:
    """A resumed run saves `"resume": true` in its checkpoints; loading that file without --resume
    must start a new run (and so be refused by a folder holding a run), as for a run never resumed."""
    run = tmp_path / "run"
    step = run / "checkpoints" / "000004" / "pretrained_model"
    step.mkdir(parents=True)
    saved = to_dict(parse_train_config([f"--output_dir={run}"]))
    saved["resume"] = True
    save_json(step / "train_config.json", saved)
    fresh = parse_train_config([f"--config_path={step / 'train_config.json'}", "--steps=50"])
    assert fresh.resume is False and fresh.steps == 50 and fresh.output_dir == run
    again = parse_train_config(["--resume=true", f"--config_path={step / 'train_config.json'}"])
    assert again.resume is True and again.output_dir == run


def test_a_resume_given_a_new_policy_path_keeps_its_checkpoints_policy_settings(tmp_path: Path) -> None:
    """A LoRA resume whose base moved says where it is now with --policy.path; the settings the run
    trained with (here an override of the base's dropout) stay, where a new run starts from the base."""
    base = _saved_policy(tmp_path / "base", ACTConfig(dim_model=32, n_heads=2, dropout=0.0))
    moved = _saved_policy(tmp_path / "moved", ACTConfig(dim_model=32, n_heads=2, dropout=0.0))
    run = tmp_path / "run"
    saved = parse_train_config([f"--policy.path={base}", "--policy.dropout=0.3", f"--output_dir={run}"])
    step = run / "checkpoints" / "000004" / "pretrained_model"
    save_json(step / "train_config.json", to_dict(saved))
    cfg = parse_train_config(["--resume=true", f"--config_path={step.parent}", f"--policy.path={moved}"])
    assert cfg.policy == dataclasses.replace(saved.policy, path=moved)
    assert parse_train_config(config_to_flags(cfg)) == cfg
    fresh = parse_train_config([f"--config_path={step.parent}", f"--policy.path={moved}", f"--output_dir={tmp_path / 'new'}"])
    assert isinstance(fresh.policy, ACTConfig) and fresh.policy.dropout == 0.0  # a new run starts from the path's config


def test_switching_policy_type_over_a_config_file_keeps_where_it_runs_and_publishes(tmp_path: Path) -> None:
    base = _saved_policy(tmp_path / "base", ACTConfig())
    saved = parse_train_config(["--policy.device=cpu", f"--policy.path={base}", "--policy.repo_id=me/m", "--policy.chunk_size=20"])
    save_json(tmp_path / "train_config.json", to_dict(saved))
    cfg = parse_train_config([f"--config_path={tmp_path}", "--policy.type=mlp"])
    assert cfg.policy == MLPConfig(device="cpu", path=base, repo_id="me/m")
    same = parse_train_config([f"--config_path={tmp_path}", "--policy.type=act"])
    assert same.policy == saved.policy  # the same type keeps every saved policy value


def test_missing_config_path(tmp_path: Path) -> None:
    assert error_of([f"--config_path={tmp_path / 'nope.json'}"]).startswith(f"--config_path: {tmp_path / 'nope.json'} does not exist")


def test_config_path_with_an_unknown_key_or_version_is_refused(tmp_path: Path) -> None:
    data = to_dict(TrainConfig())
    data["accelerator"]["fsdp"]["wrap_everything"] = True
    save_json(tmp_path / "a.json", data)
    message = error_of([f"--config_path={tmp_path / 'a.json'}"])
    assert str(tmp_path / "a.json") in message
    assert "--accelerator.fsdp.wrap_everything: unknown setting" in message
    data = to_dict(TrainConfig())
    data["version"] = 99
    save_json(tmp_path / "b.json", data)
    message = error_of([f"--config_path={tmp_path / 'b.json'}"])
    assert message.startswith(f"{tmp_path / 'b.json'}: schema version 99 is not supported")


def test_config_path_with_a_string_for_a_list_or_an_unknown_normalization_key_is_refused(tmp_path: Path) -> None:
    data = to_dict(TrainConfig())
    data["accelerator"]["fsdp"]["wrap_modules"] = "Block"
    data["policy"]["normalization_mapping"]["STAT"] = "min_max"
    save_json(tmp_path / "a.json", data)
    message = error_of([f"--config_path={tmp_path / 'a.json'}"])
    assert message.splitlines() == [
        f"invalid {tmp_path / 'a.json'}:",
        "  --policy.normalization_mapping.STAT: unknown key (did you mean 'STATE'?); the keys are STATE, ENV, VISUAL, ACTION",
        """  --accelerator.fsdp.wrap_modules: expected a JSON list, got the text 'Block'; a list of one is --accelerator.fsdp.wrap_modules='["Block"]'""",
    ]


@pytest.mark.parametrize("kind", [["act"], {"name": "act"}, 1, None])
def test_config_path_with_a_policy_type_that_is_not_a_name_is_refused(tmp_path: Path, kind: Any) -> None:
    data = to_dict(TrainConfig())
    data["policy"]["type"] = kind
    save_json(tmp_path / "a.json", data)
    message = error_of([f"--config_path={tmp_path / 'a.json'}"])
    assert message == f"invalid {tmp_path / 'a.json'}:\n  --policy.type: expected a policy type name, got {kind!r}; known types: {', '.join(policy_types())}"


def test_a_saved_policy_config_with_a_bad_type_or_normalization_key_is_refused() -> None:
    from lr_config import PolicyConfig
    from lr_config._serde import from_dict

    data = {**to_dict(ACTConfig()), "type": ["act"]}
    with pytest.raises(ConfigError, match=r"^invalid config.json:\n  --type: expected a policy type name, got \['act'\]"):
        from_dict(PolicyConfig, data, source="config.json")  # type: ignore[arg-type]
    data = {**to_dict(ACTConfig()), "type": "act", "normalization_mapping": {"state": "identity"}}
    with pytest.raises(ConfigError, match=r"--normalization_mapping.state: unknown key \(did you mean 'STATE'\?\)"):
        from_dict(PolicyConfig, data, source="config.json")  # type: ignore[arg-type]


# --help


def _help_rows() -> dict[str, tuple[str, str, str]]:
    """flag path -> (type, default, doc) as format_help prints them."""
    lines = format_help().splitlines()
    rows: dict[str, tuple[str, str, str]] = {}
    for line, doc_line in zip(lines, lines[1:]):
        if line.startswith("  --"):
            path, type_name, default = line.strip().split("  ")
            assert default.startswith("(default: ") and default.endswith(")")
            rows[path.removeprefix("--")] = (type_name, default[len("(default: ") : -1], doc_line.strip())
    return rows


def _default_at(path: str) -> Any:
    for cfg in [TrainConfig(policy=cls()) for cls in policy_types().values()]:  # the installed plugins' too
        node: Any = to_dict(cfg)
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            return node
    raise AssertionError(f"no default for {path}")


def test_help_lists_every_flag_with_type_default_and_doc() -> None:
    rows = _help_rows()
    assert list(rows) == all_flag_paths()
    for path, (type_name, default, doc) in rows.items():
        assert type_name, path
        assert doc and not doc.startswith("--"), path
        assert json.loads(default) == _default_at(path), path


def test_help_rows_read_as_documented() -> None:
    rows = _help_rows()
    assert rows["batch_size"] == ("int", "32", "Per-process micro-batch size.")
    assert rows["accelerator.fsdp.min_num_params"][:2] == ("int | null", "null")
    assert rows["accelerator.mixed_precision"][:2] == ("no|bf16|fp16", '"no"')
    assert rows["policy.type"][:2] == ("|".join(policy_types()), '"act"')
    assert rows["policy.type"][0].startswith("act|mlp")  # the built-ins first, then the installed plugins
    assert rows["policy.hidden_dim"][1] == "256"
    assert format_help(prog="lr-engine train").startswith("usage: lr-engine train [--name=value ...]")


def _saved_policy(folder: Path, config: ACTConfig | MLPConfig) -> Path:
    save_json(folder / "config.json", policy_config_dict(config))
    return folder


def test_policy_path_starts_from_its_config_and_the_other_policy_flags_apply(tmp_path: Path) -> None:
    """As in lerobot-train: `--policy.path` gives the saved settings, `--policy.*` flags override
    them (they were once dropped silently, and train_config.json said the base's values)."""
    base = _saved_policy(tmp_path / "base", ACTConfig(dim_model=32, n_heads=2, dropout=0.0, n_action_steps=10, repo_id="old/repo"))
    cfg = parse_train_config([f"--policy.path={base}", "--policy.dropout=0.1", "--policy.n_action_steps=5"])
    assert isinstance(cfg.policy, ACTConfig) and cfg.policy.path == base
    assert (cfg.policy.dim_model, cfg.policy.n_heads) == (32, 2)  # from the saved config
    assert (cfg.policy.dropout, cfg.policy.n_action_steps) == (0.1, 5)  # the flags win (0.1 is also the default)
    assert cfg.policy.repo_id is None  # where this run publishes is not taken from the base
    again = parse_train_config(config_to_flags(cfg))
    assert again == cfg


def test_policy_path_sets_the_type_and_a_contradicting_type_is_refused(tmp_path: Path) -> None:
    base = _saved_policy(tmp_path / "mlp_base", MLPConfig(hidden_dim=7))
    cfg = parse_train_config([f"--policy.path={base}"])
    assert isinstance(cfg.policy, MLPConfig) and cfg.policy.hidden_dim == 7
    assert "holds a 'mlp' policy, but --policy.type is 'act'; drop --policy.type" in error_of([f"--policy.path={base}", "--policy.type=act"])
    assert "config.json is missing" in error_of([f"--policy.path={tmp_path / 'nowhere'}"])


def test_a_dry_run_and_its_world_size_are_requests_of_the_command_never_read_from_a_file(tmp_path: Path) -> None:
    saved = to_dict(parse_train_config(["--dry_run=true", "--world_size=8", "--steps=7"]))
    save_json(tmp_path / "train_config.json", saved)
    cfg = parse_train_config([f"--config_path={tmp_path}"])
    assert (cfg.dry_run, cfg.world_size, cfg.steps) == (False, None, 7)
    planned = parse_train_config([f"--config_path={tmp_path}", "--dry_run=true", "--world_size=2"])
    assert (planned.dry_run, planned.world_size) == (True, 2)


def _a_run(root: Path, steps: tuple[int, ...] = (2, 4)) -> Path:
    """A run folder as the engine leaves it: its own train_config.json, checkpoints/<step>/ and last."""
    save_json(root / "train_config.json", to_dict(parse_train_config([f"--output_dir={root}", "--steps=99"])))
    for step in steps:
        save_json(root / "checkpoints" / f"{step:06d}" / "pretrained_model" / "train_config.json",
                  to_dict(parse_train_config([f"--output_dir={root}", f"--steps={step * 10}"])))
    if steps:
        (root / "checkpoints" / "last").symlink_to(f"{steps[-1]:06d}")
    return root


def test_a_resume_of_a_run_folder_or_its_checkpoints_folder_continues_from_last(tmp_path: Path) -> None:
    run = _a_run(tmp_path / "run")
    last = run / "checkpoints" / "last" / "pretrained_model" / "train_config.json"
    for config_path in (run, run / "checkpoints"):
        cfg = parse_train_config(["--resume=true", f"--config_path={config_path}"])
        assert (cfg.config_path, cfg.output_dir, cfg.steps) == (last, run, 40)
    # without --resume, the run folder means the run's own settings; checkpoints/ still means last
    assert parse_train_config([f"--config_path={run}"]).steps == 99
    assert parse_train_config([f"--config_path={run / 'checkpoints'}"]).steps == 40
    empty = _a_run(tmp_path / "crashed", steps=())
    (empty / "checkpoints").mkdir()
    with pytest.raises(ConfigError, match=r"--config_path: .*crashed has no checkpoint to resume \(.*checkpoints/last does not name a saved step\)"):
        parse_train_config(["--resume=true", f"--config_path={empty}"])


@pytest.mark.parametrize(
    ("name", "what"),
    [("config.json", "the policy's config.json"), ("training_step.json", "a checkpoint's training state"), ("run.json", "a run's status file")],
)
def test_config_path_naming_another_lr_file_says_which_file_it_is(tmp_path: Path, name: str, what: str) -> None:
    step = _a_run(tmp_path / "run") / "checkpoints" / "000004" / "pretrained_model"
    (step / name).write_text("{}")
    with pytest.raises(ConfigError, match=rf"--config_path: .*{name} is {what}.*, not a train_config.json; pass .*000004/pretrained_model/train_config.json"):
        parse_train_config([f"--config_path={step / name}"])


def test_a_new_dataset_over_a_config_file_is_looked_up_again_with_its_own_features(tmp_path: Path) -> None:
    """A run saves the folder it found its dataset in (dataset.root) and the features it read there:
    a new --dataset.repo_id must not train on the old folder with the old features."""
    features = {"observation.state": FeatureSpec("STATE", [2])}
    saved = parse_train_config(["--dataset.repo_id=me/old", f"--dataset.root={tmp_path / 'old'}", "--policy.type=mlp"])
    saved.policy.input_features, saved.policy.output_features = features, {"action": FeatureSpec("ACTION", [2])}
    save_json(tmp_path / "train_config.json", to_dict(saved))
    same = parse_train_config([f"--config_path={tmp_path}", "--steps=5"])
    assert same.dataset == saved.dataset and same.policy.input_features == features
    moved = parse_train_config([f"--config_path={tmp_path}", "--dataset.repo_id=me/new"])
    assert (moved.dataset.repo_id, moved.dataset.root) == ("me/new", None)
    assert (moved.policy.input_features, moved.policy.output_features) == (None, None)
    rooted = parse_train_config([f"--config_path={tmp_path}", f"--dataset.root={tmp_path / 'new'}"])
    assert rooted.dataset.root == tmp_path / "new" and rooted.policy.input_features is None
    kept = parse_train_config([f"--config_path={tmp_path}", "--dataset.repo_id=me/new", '--policy.input_features={"observation.state": {"type": "STATE", "shape": [2]}}'])
    assert kept.policy.input_features == features and kept.policy.output_features is None
    for cfg in (moved, rooted, kept):  # the launch flags rebuild it
        assert parse_train_config(config_to_flags(cfg)) == cfg


def test_a_config_file_with_a_policy_path_keeps_its_policy_overrides_when_the_path_is_given_again(tmp_path: Path) -> None:
    """The TUI fills the 'policy path' field from the file and gives it as a flag: the same path
    must not start the policy settings over from the base's config.json."""
    base = _saved_policy(tmp_path / "base", ACTConfig(dim_model=32, n_heads=2, dropout=0.0))
    save_json(tmp_path / "ft.json", to_dict(parse_train_config([f"--policy.path={base}", "--policy.dropout=0.3"])))
    again = parse_train_config([f"--config_path={tmp_path / 'ft.json'}", f"--policy.path={base}"])
    assert isinstance(again.policy, ACTConfig) and again.policy.dropout == 0.3
    other = _saved_policy(tmp_path / "other", ACTConfig(dim_model=32, n_heads=2, dropout=0.0))
    assert parse_train_config([f"--config_path={tmp_path / 'ft.json'}", f"--policy.path={other}"]).policy.dropout == 0.0


def test_a_resume_from_a_moved_dataset_folder_keeps_the_checkpoints_features(tmp_path: Path) -> None:
    features = {"observation.state": FeatureSpec("STATE", [2])}
    saved = parse_train_config([f"--dataset.root={tmp_path / 'old'}", "--policy.type=mlp", f"--output_dir={tmp_path / 'run'}"])
    saved.policy.input_features, saved.policy.output_features = features, {"action": FeatureSpec("ACTION", [2])}
    step = tmp_path / "run" / "checkpoints" / "000004"
    save_json(step / "pretrained_model" / "train_config.json", to_dict(saved))
    cfg = parse_train_config(["--resume=true", f"--config_path={step}", f"--dataset.root={tmp_path / 'moved'}"])
    assert cfg.dataset.root == tmp_path / "moved" and cfg.policy.input_features == features
    assert parse_train_config(config_to_flags(cfg)) == cfg


def test_a_preset_named_like_another_lr_file_still_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    save_json(tmp_path / "config.json", to_dict(parse_train_config(["--steps=50"])))
    assert parse_train_config(["--config_path=config.json"]).steps == 50


def test_dot_inside_the_checkpoints_folder_means_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _a_run(tmp_path / "run")
    monkeypatch.chdir(run / "checkpoints")
    for dot in (".", "./"):
        cfg = parse_train_config(["--resume=true", f"--config_path={dot}"])
        assert cfg.steps == 40 and cfg.output_dir == run


def test_the_optimizer_note_says_how_lrs_optimizer_differs_from_lerobot_trains_preset() -> None:
    from lr_config import lerobot_optimizer_note

    def note(*flags: str) -> str | None:
        return lerobot_optimizer_note(parse_train_config(list(flags)))

    assert note() is None and note("--policy.type=mlp") is None  # lr's demo preset; a policy without a preset
    assert note("--policy.type=act") == (
        "optimizer: adamw lr 0.001, weight decay 0.0001, cosine after 20 warmup steps; lerobot-train's preset for act is adamw lr "
        "1e-05, weight decay 0.0001, constant: --optimizer.lr=1e-05 --scheduler.type=constant --scheduler.warmup_steps=0 trains as it does")
    lerobots = ["--policy.type=act", "--optimizer.lr=1e-5", "--scheduler.type=constant", "--scheduler.warmup_steps=0"]
    assert note(*lerobots) is None
    assert note(*lerobots, "--optimizer.type=sgd").endswith(": --optimizer.type=adamw trains as it does")  # type: ignore[union-attr]
    assert note(*lerobots, "--policy.optimizer_lr_backbone=1e-6").endswith(  # type: ignore[union-attr]
        "constant, backbone lr 1e-06: lr trains every parameter at --optimizer.lr")
    assert note("--policy.type=act", "--policy.optimizer_lr_backbone=1e-6").endswith(  # type: ignore[union-attr]
        " (but for its backbone lr 1e-06: lr trains every parameter at --optimizer.lr)")


def test_no_policy_flag_is_the_demo_preset_and_policy_type_act_is_lerobots_defaults() -> None:
    from lr_config import config_to_flags, demo_act, demo_preset_note

    preset = parse_train_config([]).policy
    assert preset == demo_act() and demo_preset_note(preset) is not None
    assert "demo preset" in (demo_preset_note(preset) or "") and "--policy.type=act alone gives LeRobot's defaults" in (demo_preset_note(preset) or "")
    lerobot = parse_train_config(["--policy.type=act"]).policy
    assert lerobot == ACTConfig() and demo_preset_note(lerobot) is None
    assert (lerobot.chunk_size, lerobot.dim_model, lerobot.n_heads, lerobot.pretrained_backbone_weights) == (100, 512, 8, "ResNet18_Weights.IMAGENET1K_V1")
    merged = parse_train_config(["--policy.dim_model=64"]).policy
    assert merged == dataclasses.replace(demo_act(), dim_model=64)  # other policy flags are merged over the preset
    # the launch flags of each: the shorter of "over the preset" and "--policy.type=act + differences"
    assert config_to_flags(parse_train_config([])) == []
    assert config_to_flags(parse_train_config(["--policy.type=act"])) == ["--policy.type=act"]
    assert config_to_flags(parse_train_config(["--policy.dim_model=64"])) == ["--policy.dim_model=64"]
    for argv in ([], ["--policy.type=act"], ["--policy.dim_model=64"], ["--policy.type=act", "--policy.chunk_size=20"]):
        cfg = parse_train_config(argv)
        assert parse_train_config(config_to_flags(cfg)) == cfg, argv
