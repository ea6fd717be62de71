"""Saved files hold every field: a file missing any (nested) field is refused, naming them."""

import json

import pytest

from lr_config import (
    ADAPTER_BASE_VERSION,
    FILES_VERSION,
    AdapterBase,
    TRAINING_STEP_VERSION,
    ConfigError,
    MLPConfig,
    RunStatus,
    TrainConfig,
    TrainingStep,
    load_adapter_base,
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


@pytest.mark.parametrize(
    "cls,loader,field",
    [(TrainingStep, load_training_step, "topology"), (RunStatus, load_run_status, "pid"), (AdapterBase, load_adapter_base, "sha256")],
)
def test_contract_files_missing_a_field_are_refused(tmp_path, cls, loader, field):
    data = to_dict(cls())
    assert data["version"] == {TrainingStep: TRAINING_STEP_VERSION, AdapterBase: ADAPTER_BASE_VERSION}.get(cls, FILES_VERSION)
    del data[field]
    path = tmp_path / "file.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=f"--{field}"):
        loader(path)


def test_adapter_base_round_trips_and_refuses_unknown_keys(tmp_path):
    from lr_config import save_adapter_base

    record = AdapterBase(base_model_name_or_path="/bases/act", size=123, sha256="ab" * 32)
    save_adapter_base(tmp_path / "adapter_base.json", record)
    assert load_adapter_base(tmp_path / "adapter_base.json") == record
    data = json.loads((tmp_path / "adapter_base.json").read_text())
    path = tmp_path / "extra.json"
    path.write_text(json.dumps({**data, "sha512": "x"}))
    with pytest.raises(ConfigError, match="sha512"):
        load_adapter_base(path)
