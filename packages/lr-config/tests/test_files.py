"""Schemas of training_step.json, metrics.jsonl and run.json: round trips and refusals."""

from __future__ import annotations

import dataclasses
import json
import os
import math
from pathlib import Path
from typing import Any

import pytest

from lr_config import (
    FILES_VERSION,
    TRAINING_STEP_VERSION,
    ConfigError,
    MetricsRecord,
    RunStatus,
    SchedulerConfig,
    Topology,
    TrainConfig,
    TrainingStep,
    load_run_status,
    load_train_config,
    load_training_step,
    parse_metrics_line,
    read_metrics,
    save_json,
    save_run_status,
    save_training_step,
    to_dict,
)

STEP = TrainingStep(
    step=5000,
    optimizer_updates=1250,
    epoch=3,
    epoch_offset=256,
    samples_seen=640000,
    dp_world_size=4,
    batch_size=32,
    grad_accum=4,
    precision="bf16",
    checkpoint_format="dcp",
    peft=True,
    seed=7,
    run_id="2026-11-29_act",
    topology=Topology(world_size=8, dp_replicate=2, dp_shard=4, nnodes=2),
    param_dtype="bfloat16",
    reduce_dtype="float32",
    output_dtype="bfloat16",
)
STATUS = RunStatus(
    status="finished",
    pid=4242,
    hostname="node0",
    started="2026-11-29T18:00:00Z",
    updated="2026-11-29T18:05:00Z",
    output_dir="/runs/act",
    job_name="act",
    step=300,
    steps=300,
    world_size=2,
    error=None,
)


def field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def rewrite(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_training_step_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "training_state" / "training_step.json"
    save_training_step(path, STEP)
    assert load_training_step(path) == STEP
    data = json.loads(path.read_text())
    assert set(data) == field_names(TrainingStep)
    assert set(data["topology"]) == field_names(Topology)
    assert data["version"] == TRAINING_STEP_VERSION == 4


def test_a_version_1_training_step_is_upgraded_with_an_unknown_position(tmp_path: Path) -> None:
    """Checkpoints written before `epoch_offset` stay resumable: the engine derives their position from the step."""
    data = to_dict(STEP)
    for name in ("epoch_offset", "param_dtype", "reduce_dtype", "output_dtype"):
        del data[name]
    data["version"] = 1
    path = tmp_path / "training_step.json"
    path.write_text(json.dumps(data))
    assert load_training_step(path) == dataclasses.replace(STEP, epoch_offset=None, param_dtype="", reduce_dtype="", output_dtype="")


def test_a_version_2_training_step_is_upgraded_with_unknown_dtypes(tmp_path: Path) -> None:
    data = to_dict(STEP)
    for name in ("param_dtype", "reduce_dtype", "output_dtype"):
        del data[name]
    path = tmp_path / "training_step.json"
    path.write_text(json.dumps({**data, "version": 2}))
    assert load_training_step(path) == dataclasses.replace(STEP, param_dtype="", reduce_dtype="", output_dtype="")
    path.write_text(json.dumps({**data, "version": 3}))
    with pytest.raises(ConfigError, match="incomplete file, missing"):
        load_training_step(path)


def test_defaults_are_saved_too(tmp_path: Path) -> None:
    save_training_step(tmp_path / "s.json", TrainingStep())
    assert set(json.loads((tmp_path / "s.json").read_text())) == field_names(TrainingStep)


def test_run_status_round_trip(tmp_path: Path) -> None:
    for status in (STATUS, dataclasses.replace(STATUS, status="failed", error="Traceback: boom"), RunStatus()):
        save_run_status(tmp_path / "run.json", status)
        assert load_run_status(tmp_path / "run.json") == status
        assert set(json.loads((tmp_path / "run.json").read_text())) == field_names(RunStatus)


def test_unknown_key_is_refused_naming_the_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "training_step.json"
    save_training_step(path, STEP)
    rewrite(path, learning_rate=0.1)
    with pytest.raises(ConfigError) as err:
        load_training_step(path)
    assert str(err.value).startswith(f"invalid {path}:")
    assert "--learning_rate: unknown setting" in str(err.value)


def test_unknown_nested_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "training_step.json"
    save_training_step(path, STEP)
    rewrite(path, topology={**to_dict(STEP.topology), "dp_cp": 1})
    with pytest.raises(ConfigError, match="topology.dp_cp: unknown setting"):
        load_training_step(path)


@pytest.mark.parametrize("version", [0, 9, None, "1"])
def test_unknown_version_is_refused_naming_the_file(tmp_path: Path, version: Any) -> None:
    for save, load, value in ((save_training_step, load_training_step, STEP), (save_run_status, load_run_status, STATUS)):
        path = tmp_path / "file.json"
        save(path, value)  # type: ignore[operator]
        rewrite(path, version=version)
        with pytest.raises(ConfigError) as err:
            load(path)  # type: ignore[operator]
        assert str(err.value).startswith(f"{path}: schema version {version!r} is not supported")


def test_missing_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    save_run_status(path, STATUS)
    data = json.loads(path.read_text())
    del data["version"]
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="schema version None is not supported"):
        load_run_status(path)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"step": "5000"}, "--step: expected int, got '5000'"),
        ({"step": 5000.0}, "--step: expected int, got 5000.0"),
        ({"peft": "true"}, "--peft: expected true or false, got 'true'"),
        ({"precision": 16}, "--precision: expected a string, got 16"),
    ],
)
def test_wrong_types_are_refused(tmp_path: Path, changes: dict[str, Any], expected: str) -> None:
    path = tmp_path / "training_step.json"
    save_training_step(path, STEP)
    rewrite(path, **changes)
    with pytest.raises(ConfigError) as err:
        load_training_step(path)
    assert err.value.problems == [expected]


def test_unknown_run_state_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    save_run_status(path, STATUS)
    rewrite(path, status="done")
    with pytest.raises(ConfigError, match="--status: expected one of 'running', 'finished', 'failed', 'stopped', got 'done'"):
        load_run_status(path)


def test_missing_and_broken_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"^{tmp_path / 'none.json'}: file not found"):
        load_training_step(tmp_path / "none.json")
    (tmp_path / "half.json").write_text('{"version": 1, "step"')
    with pytest.raises(ConfigError, match=f"^{tmp_path / 'half.json'}: not valid JSON"):
        load_training_step(tmp_path / "half.json")
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ConfigError, match=f"^{tmp_path / 'list.json'}: expected a JSON object"):
        load_run_status(tmp_path / "list.json")


def test_save_leaves_no_temp_file(tmp_path: Path) -> None:
    save_run_status(tmp_path / "run.json", STATUS)
    save_run_status(tmp_path / "run.json", dataclasses.replace(STATUS, step=1))
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


# metrics.jsonl


def record(step: int, **extra: Any) -> MetricsRecord:
    return MetricsRecord(step=step, epoch=0, samples=step * 64, loss=1.0 / step, lr=1e-3, grad_norm=0.5, info=extra)


def line(rec: MetricsRecord) -> str:
    return json.dumps(to_dict(rec)) + "\n"


def test_metrics_round_trip(tmp_path: Path) -> None:
    records = [record(25), record(50, kl=0.25), record(75)]
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(line(r) for r in records))
    assert read_metrics(path) == records
    assert set(json.loads(path.read_text().splitlines()[0])) == field_names(MetricsRecord)


def test_a_partial_last_line_is_left_for_later(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    full = line(record(25)) + line(record(50))
    partial = line(record(75))
    path.write_text(full + partial[:20])
    assert [r.step for r in read_metrics(path)] == [25, 50]
    path.write_text(full + partial.rstrip("\n"))  # complete JSON, but no newline yet
    assert [r.step for r in read_metrics(path)] == [25, 50]
    path.write_text(full + partial)
    assert [r.step for r in read_metrics(path)] == [25, 50, 75]


def test_empty_and_blank_metrics(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("")
    assert read_metrics(path) == []
    path.write_text("\n" + line(record(1)) + "\n")
    assert [r.step for r in read_metrics(path)] == [1]


def test_a_diverged_loss_is_still_a_record(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(line(dataclasses.replace(record(1), loss=float("nan"), grad_norm=float("inf"))))
    (rec,) = read_metrics(path)
    assert math.isnan(rec.loss) and rec.grad_norm == float("inf")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"version": 3}, ":2: unsupported metrics record version"),
        ({"bogus": 1}, "--bogus: unknown setting"),
        ({"step": 1.5}, "--step: expected int, got 1.5"),
        ({"info": {"kl": "high"}}, "--info.kl: expected float, got 'high'"),
    ],
)
def test_bad_metrics_records_name_the_line(tmp_path: Path, data: dict[str, Any], expected: str) -> None:
    path = tmp_path / "metrics.jsonl"
    bad = {**to_dict(record(2)), **data}
    path.write_text(line(record(1)) + json.dumps(bad) + "\n")
    with pytest.raises(ConfigError) as err:
        read_metrics(path)
    assert f"{path}:2" in str(err.value)
    assert expected in str(err.value)


@pytest.mark.parametrize("missing", sorted(field_names(MetricsRecord) - {"version"}))
def test_a_metrics_line_missing_a_field_is_refused(missing: str) -> None:
    """The engine writes every field of a record (to_dict), like every other contract file:
    a line without one was cut or edited, and would otherwise read as the default (0.0)."""
    data = to_dict(record(5))
    del data[missing]
    with pytest.raises(ConfigError) as err:
        parse_metrics_line(json.dumps(data), "metrics.jsonl:3")
    assert str(err.value).startswith(f"metrics.jsonl:3: incomplete metrics line, missing --{missing};")


def test_a_metrics_line_with_only_a_step_is_refused_naming_what_it_lacks() -> None:
    with pytest.raises(ConfigError, match=r"^metrics.jsonl:1: incomplete metrics line, missing --epoch, --samples, --loss, --lr, --grad_norm, --update_s and 4 more"):
        parse_metrics_line('{"version": 1, "step": 5}', "metrics.jsonl:1")


def test_a_broken_complete_line_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(line(record(1)) + "{not json\n")
    with pytest.raises(ConfigError, match=f"^{path}:2: not valid JSON"):
        read_metrics(path)


def test_checksums_of_version_1_are_upgraded_and_version_2_entries_hold_every_field(tmp_path: Path) -> None:
    from lr_config import CHECKSUMS_VERSION, Checksums, FileDigest, load_checksums, save_checksums

    path = tmp_path / "checksums.json"
    saved = Checksums(files={"a/b.bin": FileDigest(size=3, sha256="f" * 64, crc32="0000abcd")})
    save_checksums(path, saved)
    assert json.loads(path.read_text())["version"] == CHECKSUMS_VERSION == 2
    assert load_checksums(path) == saved

    path.write_text(json.dumps({"version": 1, "files": {"a/b.bin": {"size": 3, "sha256": "f" * 64}}}))
    upgraded = load_checksums(path)
    assert upgraded.version == 2 and upgraded.files == {"a/b.bin": FileDigest(size=3, sha256="f" * 64, crc32="")}

    path.write_text(json.dumps({"version": 1, "files": {"a/b.bin": {"size": 3, "sha256": "f" * 64, "md5": "x"}}}))
    with pytest.raises(ConfigError, match=r"files\.a/b\.bin\.md5: unknown setting"):
        load_checksums(path)
    path.write_text(json.dumps({"version": 2, "files": {"a/b.bin": {"size": 3, "sha256": "f" * 64}}}))
    with pytest.raises(ConfigError, match=r"incomplete file, missing --files\.a/b\.bin\.crc32"):
        load_checksums(path)
    path.write_text(json.dumps({"version": 3, "files": {}}))
    with pytest.raises(ConfigError, match="schema version 3 is not supported"):
        load_checksums(path)


def test_saved_files_get_the_umask_mode_not_a_private_one(tmp_path: Path) -> None:
    """Teammates on a shared cluster resume, convert and publish each other's checkpoints: the
    JSON files must be as readable as the weights beside them (0644 under umask 022, not 0600)."""
    old = os.umask(0o022)
    try:
        save_training_step(tmp_path / "training_step.json", STEP)
    finally:
        os.umask(old)
    assert (tmp_path / "training_step.json").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["training_step.json"]


def test_a_version_1_train_config_is_upgraded_with_the_schedule_it_had(tmp_path: Path) -> None:
    """Version 1 had no scheduler.decay_steps (its decay ended at --steps, which None means);
    a file without it that claims version 2 is incomplete."""
    path = tmp_path / "train_config.json"
    cfg = TrainConfig(steps=40, scheduler=SchedulerConfig(type="cosine"))
    save_json(path, to_dict(cfg))
    data = json.loads(path.read_text())
    del data["scheduler"]["decay_steps"]
    path.write_text(json.dumps({**data, "version": 1}))
    assert load_train_config(path) == cfg
    path.write_text(json.dumps({**data, "version": 2}))
    with pytest.raises(ConfigError, match="incomplete file, missing --scheduler.decay_steps"):
        load_train_config(path)


def test_a_version_4_train_config_is_upgraded_to_float32_policies(tmp_path: Path) -> None:
    """Version 4 had no policy.dtype (its policies were float32); a version-5 file without it is incomplete."""
    path = tmp_path / "train_config.json"
    cfg = TrainConfig(steps=40)
    save_json(path, to_dict(cfg))
    data = json.loads(path.read_text())
    assert data["version"] == 5 and data["policy"]["dtype"] == "float32"
    del data["policy"]["dtype"]
    path.write_text(json.dumps({**data, "version": 4}))
    assert load_train_config(path) == cfg
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"incomplete file, missing --policy\.dtype"):
        load_train_config(path)
