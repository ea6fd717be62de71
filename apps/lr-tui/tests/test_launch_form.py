"""launch_form.evaluate: the preview, the problem routing and presets, without the UI."""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path

from tui_support import SAMPLE_RUN

from lr_config import LaunchSpec, build_launch, format_command, parse_train_config

from lr_tui._cli_tasks import resolve_executable
from lr_tui._launch_form import GENERAL, config_file, default_output_dir, default_values, evaluate, filled_from_file, values_from_config


def _values(**changes: str) -> dict[str, str]:
    values = default_values()
    values.update(changes)
    return values


def test_preview_is_exactly_lr_configs_command():
    plan = evaluate(_values(nproc_per_node="4", dp_shard="-1", batch_size="8", grad_accum="2", steps="50"))
    cfg = parse_train_config(
        ["--steps=50", "--batch_size=8", "--accelerator.gradient_accumulation.steps=2", "--parallelism.dp_shard=-1"]
    )
    assert plan.ok
    built = build_launch(LaunchSpec(nproc_per_node=4), cfg)
    # lr-config's command, with the launcher this environment runs (not a bare name on PATH)
    assert plan.argv == [resolve_executable("torchrun"), *built[1:]] and Path(plan.argv[0]).is_absolute()
    assert plan.preview == format_command(plan.argv)
    assert plan.batch_line().splitlines() == [
        "batch 8 x dp_world 4 x grad_accum 2 = 64 effective",
        "FSDP2 dp_replicate=1 dp_shard=4 world=4",
    ]


def test_dry_run_flags_carry_the_world_size_and_the_settings():
    plan = evaluate(_values(nnodes="2", nproc_per_node="2", rdzv_endpoint="node0:29500", dp_shard="2", dp_replicate="2"))
    assert plan.dry_run_flags() == [
        "--dry_run=true",
        "--world_size=4",
        "--parallelism.dp_replicate=2",
        "--parallelism.dp_shard=2",
    ]


def test_topology_problem_is_shown_at_dp_shard_and_marks_dp_replicate():
    plan = evaluate(_values(nproc_per_node="4", dp_shard="3"))
    assert list(plan.problems) == ["dp_shard"]
    assert plan.problems["dp_shard"][0].startswith("--parallelism.dp_replicate x --parallelism.dp_shard = 1 x 3 = 3")
    assert plan.marked == {"dp_replicate"}
    assert plan.preview == "" and plan.dry_run_flags() is None


def test_type_errors_and_rules_land_on_their_fields():
    plan = evaluate(_values(batch_size="many", lr="-1"))
    assert plan.problems["batch_size"] == ["--batch_size: expected int, got 'many'"]
    plan = evaluate(_values(lr="-1", peft_method="LORA"))
    assert plan.problems["lr"] == ["--optimizer.lr: must be > 0, got -1.0"]
    assert plan.problems["peft_method"][0].startswith("--peft.method_type=LORA needs --policy.path")


def test_flags_without_a_field_report_at_more_flags():
    plan = evaluate(_values(extra="--policy.dim_model=130 --log_freq=5"))
    assert plan.problems == {"extra": ["--policy.dim_model: must be divisible by --policy.n_heads (4), got 130"]}
    plan = evaluate(_values(extra="--stepz=3"))
    assert plan.problems["extra"][0].startswith("--stepz: unknown flag (did you mean '--steps'")
    plan = evaluate(_values(extra="--steps=3"))
    assert plan.problems == {"extra": ["--steps: already set by the 'steps' field; remove it here"]}
    plan = evaluate(_values(extra="--a='unclosed"))
    assert plan.problems["extra"][0].startswith("more flags: ")


def test_launcher_settings_are_checked():
    assert evaluate(_values(nnodes="two")).problems["nnodes"] == ["nnodes: expected an integer, got 'two'"]
    plan = evaluate(_values(nnodes="2"))
    assert plan.problems["rdzv_endpoint"] == ["rdzv_endpoint: required with more than one node (HOST:PORT of node 0)"]
    plan = evaluate(_values(nnodes="2", node_rank="5", rdzv_endpoint="h:1"))
    assert plan.problems["node_rank"][0].startswith("node_rank: must be in [0, 1]")


def test_slurm_mode_previews_the_script_and_needs_an_output_dir():
    plan = evaluate(_values(launcher="slurm", nproc_per_node="2"))
    assert plan.problems["output_dir"][0].startswith("--output_dir: required for a Slurm script")
    plan = evaluate(_values(launcher="slurm", nproc_per_node="2", output_dir="out/run"))
    assert plan.ok and plan.argv is None
    assert plan.preview.startswith("#!/bin/bash\n")
    assert "srun --nodes=1" in plan.preview and "--output_dir=out/run" in plan.preview


def test_slurm_mode_needs_no_rendezvous_endpoint_for_several_nodes():
    # the script finds the head node itself; torchrun still needs one
    plan = evaluate(_values(launcher="slurm", nnodes="2", nproc_per_node="4", output_dir="/o/r"))
    assert plan.ok, plan.problems
    assert "srun --nodes=2" in plan.preview and 'export LR_RDZV_ENDPOINT="$head_node:29500"' in plan.preview
    plan = evaluate(_values(nnodes="2", nproc_per_node="4", output_dir="/o/r"))
    assert plan.problems["rdzv_endpoint"] == ["rdzv_endpoint: required with more than one node (HOST:PORT of node 0)"]


def test_fields_that_override_a_config_path_file_are_noted(tmp_path):
    run = Path(shutil.copytree(SAMPLE_RUN, tmp_path / "run"))
    checkpoint = f"{run}/checkpoints/000200"  # batch_size 8, checkpoint_format dcp, dp_shard 2
    values = _values(nproc_per_node="2", extra=f"--config_path={checkpoint}")
    plan = evaluate(values)
    assert plan.ok  # a note, not a problem: the command is valid, it just overrides the file
    assert plan.notes == [f"overrides {checkpoint}: --batch_size=32 (file: 8), --checkpoint_format=safetensors (file: dcp)"]
    assert "--batch_size=32" in plan.preview

    source = config_file(values)
    assert source is not None and source.key == (checkpoint, False)
    filled = filled_from_file(values, source)
    assert (filled["batch_size"], filled["checkpoint_format"], filled["dp_shard"]) == ("8", "dcp", "2")
    assert filled["output_dir"] == "outputs/train/sample_run"  # a new run from the file goes where the file says
    assert filled["extra"] == values["extra"] and filled["nproc_per_node"] == "2"
    plan = evaluate(filled)
    assert plan.ok and plan.notes == [] and plan.cfg == parse_train_config([f"--config_path={checkpoint}"])
    assert "--batch_size" not in plan.preview and "--checkpoint_format" not in plan.preview

    plan = evaluate({**filled, "batch_size": "16"})  # a deliberate change is emitted, and noted
    assert "--batch_size=16" in plan.preview
    assert plan.notes == [f"overrides {checkpoint}: --batch_size=16 (file: 8)"]


def test_filling_from_a_resumed_checkpoint_leaves_the_output_dir_to_the_run_folder(tmp_path):
    run = Path(shutil.copytree(SAMPLE_RUN, tmp_path / "run"))
    values = _values(nproc_per_node="2", output_dir="outputs/train/sample_run", extra=f"--config_path={run}/checkpoints/last --resume=true")
    source = config_file(values)
    assert source is not None and source.resume
    filled = filled_from_file(values, source)
    assert filled["output_dir"] == "" and filled["batch_size"] == "8"
    plan = evaluate(filled)
    assert plan.ok and plan.notes == [] and plan.cfg is not None
    assert plan.cfg.output_dir == run and plan.cfg.resume and f"--output_dir={run}" in plan.preview

    # a flag given in more flags empties its field rather than conflicting with it
    values = _values(nproc_per_node="2", extra=f"--config_path={run}/checkpoints/000100 --batch_size=4")
    source = config_file(values)
    assert source is not None
    filled = filled_from_file(values, source)
    assert filled["batch_size"] == ""
    plan = evaluate(filled)
    assert plan.ok and plan.cfg is not None and plan.cfg.batch_size == 4


def test_resuming_a_checkpoint_outside_a_run_keeps_the_output_dir_typed_for_it(tmp_path):
    step = Path(shutil.copytree(SAMPLE_RUN / "checkpoints" / "000200", tmp_path / "copied_step"))
    values = _values(nproc_per_node="2", extra=f"--config_path={step}")
    source = config_file(values)
    assert source is not None
    filled = filled_from_file(values, source)  # a new run: the output_dir saved in the file
    assert filled["output_dir"] == "outputs/train/sample_run"

    resume = {**filled, "extra": f"--config_path={step} --resume=true"}
    source = config_file(resume)
    assert source is not None and not source.output_dir_needed
    filled = filled_from_file(resume, source)  # that saved output_dir is no place to resume into
    assert filled["output_dir"] == ""
    assert evaluate(filled).problems["output_dir"][0].startswith("--output_dir: the checkpoint")

    chosen = {**filled, "output_dir": str(tmp_path / "continued")}
    source = config_file(chosen)
    assert source is not None and source.output_dir_needed
    assert filled_from_file(chosen, source)["output_dir"] == str(tmp_path / "continued")
    plan = evaluate(chosen)
    assert plan.ok and plan.notes == [] and plan.cfg is not None and plan.cfg.output_dir == tmp_path / "continued"


def test_config_file_is_none_until_the_path_names_a_train_config(tmp_path):
    assert config_file(_values(extra="--seed=3")) is None
    assert config_file(_values(extra=f"--config_path={tmp_path}/nothing")) is None
    assert config_file(_values(extra="--config_path='unclosed")) is None


def test_accelerate_launcher():
    plan = evaluate(_values(launcher="accelerate", nproc_per_node="2", mixed_precision="bf16"))
    assert plan.argv is not None
    assert plan.argv[:5] == [resolve_executable("accelerate"), "launch", "--multi_gpu", "--num_processes=2", "--mixed_precision=bf16"]


def test_values_from_config_round_trip_through_the_form():
    cfg = parse_train_config(
        ["--policy.type=mlp", "--policy.hidden_dim=64", "--steps=77", "--parallelism.dp_shard=2", "--log_freq=3", "--dataset.root=/data/x"]
    )
    values = values_from_config(cfg, LaunchSpec(nproc_per_node=2))
    assert values["policy_type"] == "mlp" and values["steps"] == "77" and values["dp_shard"] == "2"
    assert values["dataset_root"] == "/data/x"
    assert values["extra"] == "--log_freq=3 --policy.hidden_dim=64"
    plan = evaluate(values)
    assert plan.ok and plan.cfg == cfg


def test_general_problems_have_their_own_key():
    plan = evaluate(_values(extra="--version=99"))  # a schema version that does not exist
    assert "--version" in plan.problems["extra"][0]
    assert GENERAL not in plan.problems


def test_default_output_dir_is_dated_and_named_after_the_job():
    cfg = parse_train_config(["--job_name=pick"])
    assert default_output_dir(cfg, datetime(2025, 3, 4, 5, 6, 7)) == Path("outputs/train/2025-03-04/05-06-07_pick")
    assert default_output_dir(parse_train_config([]), datetime(2025, 3, 4, 5, 6, 7)).name.endswith("_act")


def test_half_typed_flags_never_raise():
    # typing "--policy.dim_model=..." passes through "--policy", a group given a value
    for extra in ("--policy", "--policy=1", "--optimizer=3", "--", "--=", "-x"):
        plan = evaluate(_values(extra=extra))
        assert plan.problems["extra"], extra


def test_a_filled_form_keeps_the_files_policy_settings_and_drops_its_dataset_folder_for_a_new_id(tmp_path):
    """Filled fields that hold the file's values are not given as flags, so the parser's rules
    over a file apply: the same policy path keeps the file's policy overrides, and a new dataset
    id is looked up again instead of training on the folder the file saved."""
    from lr_config import ACTConfig, policy_config_dict, save_json, to_dict

    base = tmp_path / "base"
    save_json(base / "config.json", policy_config_dict(ACTConfig(dim_model=32, n_heads=2, dropout=0.0)))
    saved = parse_train_config([f"--policy.path={base}", "--policy.dropout=0.3", f"--dataset.root={tmp_path / 'data'}"])
    save_json(tmp_path / "ft.json", to_dict(saved))
    values = _values(extra=f"--config_path={tmp_path / 'ft.json'}")
    source = config_file(values)
    assert source is not None
    filled = filled_from_file(values, source)
    assert filled["policy_path"] == str(base) and filled["dataset_root"] == str(tmp_path / "data")
    plan = evaluate(filled)
    assert plan.cfg is not None and plan.cfg.policy.dropout == 0.3 and plan.notes == []
    moved = evaluate({**filled, "dataset_repo_id": "me/other"})
    assert moved.cfg is not None and (moved.cfg.dataset.repo_id, moved.cfg.dataset.root) == ("me/other", None)
    assert "--dataset.root=null" in moved.preview and str(tmp_path / "data") not in moved.preview


def test_a_resume_in_the_form_is_checked_against_its_checkpoints_step(tmp_path):
    """As the engine would refuse it at start-up (and the Monitor's resume command does)."""
    run = Path(shutil.copytree(SAMPLE_RUN, tmp_path / "run"))
    values = _values(nproc_per_node="2", extra=f"--config_path={run}/checkpoints/000200 --resume=true")
    source = config_file(values)
    assert source is not None
    filled = filled_from_file(values, source)
    assert evaluate(filled).ok
    plan = evaluate({**filled, "steps": "200"})
    assert plan.problems["steps"] == ["--steps: the checkpoint is at step 200; pass --steps > 200 to continue"]
    plan = evaluate({**filled, "grad_accum": "3", "extra": values["extra"] + " --save_freq=3"})
    assert plan.problems["grad_accum"][0].startswith("--accelerator.gradient_accumulation.steps: the checkpoint is at step 200, which is not a multiple of 3")
