"""Saved files hold every field: a file missing any (nested) field is refused, naming them."""

import json

import pytest

from lr_config import (
    FILES_VERSION,
    TRAINING_STEP_VERSION,
    ConfigError,
    MLPConfig,
    RunStatus,
    TrainConfig,
    TrainingStep,
    load_run_status,
    load_training_step,
    parse_train_config,
    to_dict,
)


def test_a_config_file_missing_nested_fields_is_refused(tmp_path):
    data = to_dict(TrainConfig(policy=MLPConfig()))
    del data["accelerator"]["fsdp"]["mixed_precision_policy"]["reduce_dtype"]
    del data["policy"]["hidden_dim"]
    path = tmp_path / "train_config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as err:
        parse_train_config([f"--config_path={path}"])
    text = str(err.value)
    assert str(path) in text and "--policy.hidden_dim" in text and "--accelerator.fsdp.mixed_precision_policy.reduce_dtype" in text


def test_complete_files_load(tmp_path):
    path = tmp_path / "train_config.json"
    path.write_text(json.dumps(to_dict(TrainConfig(policy=MLPConfig(hidden_dim=7)))))
    assert parse_train_config([f"--config_path={path}"]).policy == MLPConfig(hidden_dim=7)


@pytest.mark.parametrize("cls,loader,field", [(TrainingStep, load_training_step, "topology"), (RunStatus, load_run_status, "pid")])
def test_contract_files_missing_a_field_are_refused(tmp_path, cls, loader, field):
    data = to_dict(cls())
    assert data["version"] == (TRAINING_STEP_VERSION if cls is TrainingStep else FILES_VERSION)
    del data[field]
    path = tmp_path / "file.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=f"--{field}"):
        loader(path)
