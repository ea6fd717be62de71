"""PEFT/LoRA on every layout, with the `peft` library.

`--policy.path=<base> --peft.method_type=LORA --peft.r=16` loads the base policy (fp32, from
safetensors), then wraps it with `peft.get_peft_model`. Adapters go on the policy's linear
layers (`_peft_target_modules`) unless `--peft.target_modules` says otherwise;
`--peft.full_training_modules` are trained in full beside them (PEFT `modules_to_save`).
The frozen base is then sharded together with the adapters like any model: wrap units
are found by class name inside the PEFT model, and `--accelerator.fsdp.ignored_modules`
matches its module names (which start with `base_model.model.`).

Checkpoints hold only the trainable tensors (`adapter_model.safetensors`, or DCP shards of
them) under the PEFT model's parameter names, plus `adapter_config.json` (the LoRA config
with `base_model_name_or_path`). `load_adapter_policy(dir)` rebuilds base + adapters.

The adapters are only meaningful on the base they were trained on, and a base path may come
to hold other weights (`<run>/checkpoints/last/pretrained_model` moves as that run goes on).
So every adapter folder lr writes (checkpoints and the final model; not publish folders)
also holds `adapter_base.json` (`lr_config.AdapterBase`, version 1): the base's path, and the size and
SHA-256 of its `model.safetensors`. A resume refuses a base whose weights differ from the
record, naming --policy.path; a checkpoint saved before the record existed resumes with a
warning. The SHA-256 is taken once per run, or read from `checksums.json` when the base is a
checkpoint's `pretrained_model` (that file recorded it when the checkpoint was saved).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from lr_config import AdapterBase, ConfigError, TrainConfig, load_adapter_base, load_checksums, read_json_object, save_adapter_base, save_json
from lr_config.layout import MODEL_DCP, MODEL_WEIGHTS, PRETRAINED
from safetensors import safe_open
from torch import nn

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_BASE = "adapter_base.json"
BASE_WEIGHTS = "model.safetensors"
_LOW_PRECISION = {"BF16": "bfloat16", "F16": "float16"}


def stored_low_precision(base: Path) -> str | None:
    """'bfloat16'/'float16' when the base's model.safetensors stores such weights (headers only)."""
    path = Path(base) / MODEL_WEIGHTS
    if not path.exists():
        return None
    with safe_open(str(path), framework="pt") as f:
        for key in f.keys():
            dtype = f.get_slice(key).get_dtype()
            if dtype in _LOW_PRECISION:
                return _LOW_PRECISION[dtype]
    return None


def check_base_precision(cfg: TrainConfig) -> None:
    """A low-precision base needs mixed precision: FSDP2 shards trainables of one dtype together."""
    assert cfg.policy.path is not None
    dtype = stored_low_precision(cfg.policy.path)
    if dtype is not None and cfg.accelerator.mixed_precision == "no":
        raise ConfigError(
            f"--accelerator.mixed_precision: the base at {cfg.policy.path} stores {dtype} weights; set "
            f"--accelerator.mixed_precision={'bf16' if dtype == 'bfloat16' else 'fp16'} (trainable parameters stay fp32)"
        )


def lora_config(cfg: TrainConfig, policy: nn.Module) -> Any:
    from peft import LoraConfig

    peft = cfg.peft
    targets = peft.target_modules or list(getattr(policy, "_peft_target_modules", []))
    if not targets:
        raise ConfigError(f"--peft.target_modules: {type(policy).__name__} declares no default LoRA targets; list module names")
    return LoraConfig(
        r=peft.r,
        lora_alpha=peft.lora_alpha if peft.lora_alpha is not None else peft.r,
        lora_dropout=peft.lora_dropout,
        target_modules=targets,
        modules_to_save=peft.full_training_modules,
    )


def apply_lora(policy: nn.Module, cfg: TrainConfig) -> nn.Module:
    """The PEFT model around `policy` (base frozen, adapters and full_training_modules trainable, fp32)."""
    from peft import get_peft_model

    check_base_precision(cfg)
    config = lora_config(cfg, policy)
    try:
        model = get_peft_model(policy, config)
    except ValueError as exc:
        raise ConfigError(f"--peft.target_modules: {exc}") from None
    for p in model.parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()
    return model


def adapter_config_dict(model: nn.Module, base_path: Path) -> dict[str, Any]:
    config = model.peft_config["default"]  # type: ignore[index, union-attr, operator]
    data: dict[str, Any] = json.loads(json.dumps(config.to_dict(), default=lambda v: sorted(v) if isinstance(v, set) else str(v)))
    data["base_model_name_or_path"] = str(base_path)
    return data


def write_adapter_config(directory: Path, model: nn.Module, base_path: Path) -> None:
    save_json(directory / ADAPTER_CONFIG, adapter_config_dict(model, base_path))


def load_adapter_policy(directory: Path) -> nn.Module:
    """Base policy (from adapter_config.json's base path) + the trained adapters of `directory`."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file

    from ._policies.registry import load_pretrained

    directory = Path(directory)
    config_path = directory / ADAPTER_CONFIG
    data = read_json_object(config_path, missing=": missing; not an adapter checkpoint")
    weights = directory / ADAPTER_WEIGHTS
    if not weights.exists():
        hint = " it has only DCP shards: run lr-checkpoint convert first" if (directory / MODEL_DCP).exists() else ""
        raise ConfigError(f"--policy.path: {weights} is missing;{hint}")
    base = load_pretrained(Path(data["base_model_name_or_path"]))
    known = set(LoraConfig.__dataclass_fields__)
    model = get_peft_model(base, LoraConfig(**{k: v for k, v in data.items() if k in known and k != "base_model_name_or_path"}))
    missing, unexpected = model.load_state_dict(load_file(str(weights)), strict=False)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    if unexpected or trainable & set(missing):
        raise ConfigError(f"{weights}: does not match the adapter config (unexpected {sorted(unexpected)[:3]}, missing {sorted(trainable & set(missing))[:3]})")
    return model


def _recorded_sha256(weights: Path, size: int) -> str:
    """The SHA-256 that the checkpoint holding `weights` (a step's pretrained_model/model.safetensors)
    recorded in its checksums.json when it was saved, or "" (not in a checkpoint, no record, or
    a size that no longer matches)."""
    real = weights.resolve()
    sums_path = real.parent.parent / "checksums.json"
    if real.parent.name != PRETRAINED or not sums_path.is_file():
        return ""
    try:
        entry = load_checksums(sums_path).files.get(f"{PRETRAINED}/{real.name}")
    except ConfigError:
        return ""
    return entry.sha256 if entry is not None and entry.size == size else ""


def base_record(base: Path) -> AdapterBase:
    """The identity of the base at `base` (--policy.path): its model.safetensors' size and SHA-256."""
    weights = Path(base) / BASE_WEIGHTS
    try:
        size = weights.stat().st_size
        sha256 = _recorded_sha256(weights, size)
        if not sha256:
            with open(weights, "rb") as f:
                sha256 = hashlib.file_digest(f, "sha256").hexdigest()
    except OSError as exc:
        raise ConfigError(f"--policy.path: {weights} cannot be read ({exc.strerror or exc}); LoRA needs the base model's weights") from None
    return AdapterBase(base_model_name_or_path=str(base), weights=BASE_WEIGHTS, size=size, sha256=sha256)


def write_base_record(directory: Path, record: AdapterBase) -> None:
    save_adapter_base(Path(directory) / ADAPTER_BASE, record)


def read_base_record(directory: Path) -> AdapterBase | None:
    """The base record of an adapter folder; None when it has none (saved before lr wrote one)."""
    path = Path(directory) / ADAPTER_BASE
    if not path.exists():
        return None
    return load_adapter_base(path)  # a damaged or unknown file: a ConfigError naming it
