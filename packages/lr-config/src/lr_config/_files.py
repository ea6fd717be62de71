"""Schemas of the other contract files, each versioned.

| file                  | dataclass      | written by                  |
|-----------------------|----------------|-----------------------------|
| `training_step.json`  | `TrainingStep` | checkpoint (main rank); version 4 (`TRAINING_STEP_VERSION`), versions 1 to 3 upgraded on load |
| `metrics.jsonl`       | `MetricsRecord`| engine (main rank), a line per log step (and per `--eval_freq` step); version 2 (`METRICS_VERSION`), version 1 lines upgraded when read |
| `run.json`            | `RunStatus`    | engine (main rank)          |
| `checksums.json`      | `Checksums`    | checkpoint (main rank, at commit); version 2 (`CHECKSUMS_VERSION`), version 1 upgraded on load |
| `adapter_base.json`   | `AdapterBase`  | engine (main rank), in a LoRA run's checkpoints and final model: the base its adapters belong to |
| `train_config.json`   | `TrainConfig`  | engine, in each run and checkpoint; version 5 (`TRAIN_CONFIG_VERSION`), versions 1 to 4 upgraded on load (`load_train_config`; an earlier `act` is refused) |

Readers use `load_training_step` / `load_run_status` / `read_metrics` (`parse_metrics_line`
for one line), which refuse unknown keys and versions, and missing fields (lr writes every
field, defaults included), with a message naming the file (and line).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ._configs import TRAIN_CONFIG_VERSION, DatasetConfig, EvalAggregate, EvalConfig, EvalEnvConfig, TrainConfig
from ._errors import ConfigError
from ._serde import check_complete, from_dict, load_json, save_json, to_dict
from ._topology import Topology

__all__ = [
    "ADAPTER_BASE_VERSION",
    "AdapterBase",
    "CHECKSUMS_VERSION",
    "Checksums",
    "FILES_VERSION",
    "FileDigest",
    "MetricsRecord",
    "RunStatus",
    "TRAINING_STEP_VERSION",
    "METRICS_VERSION",
    "TrainingStep",
    "holds_a_run",
    "load_adapter_base",
    "load_checksums",
    "load_train_config",
    "load_run_status",
    "load_training_step",
    "parse_metrics_line",
    "read_metrics",
    "save_adapter_base",
    "save_checksums",
    "save_run_status",
    "save_training_step",
]

FILES_VERSION = 1
TRAINING_STEP_VERSION = 4
METRICS_VERSION = 2
"""training_step.json's own version: 2 added `TrainingStep.epoch_offset`, 3 the effective dtypes
(older files are upgraded)."""
CHECKSUMS_VERSION = 2
"""checksums.json's own version: 2 added `FileDigest.crc32` (version 1 files are upgraded)."""
RunState = Literal["running", "finished", "failed", "stopped"]


@dataclass
class TrainingStep:
    """Where a checkpoint stands: enough to resume and to tell what changed. Its own version
    (`TRAINING_STEP_VERSION`): 2 added `epoch_offset`, 3 the dtypes, 4 the last `--eval_freq` result."""

    version: int = TRAINING_STEP_VERSION
    step: int = 0
    optimizer_updates: int = 0
    epoch: int = 0
    """The epoch of the next sample."""
    epoch_offset: int | None = 0
    """Samples of `epoch`'s global order already consumed: with `epoch`, the data position to
    resume from, whatever global batches the run used before. None in a version-1 file, whose
    position is derived from `step` (exact only if one global batch was used from step 0)."""
    samples_seen: int = 0
    """Samples consumed since step 0, over every resume."""
    dp_world_size: int = 1
    batch_size: int = 1
    grad_accum: int = 1
    precision: str = "no"
    checkpoint_format: str = "safetensors"
    peft: bool = False
    seed: int = 0
    run_id: str = ""
    topology: Topology = field(default_factory=Topology)
    param_dtype: str = ""
    """The dtype the forward computes in (autocast's, or FSDP2's `param_dtype`); "" in older files."""
    reduce_dtype: str = ""
    """The dtype gradients are reduced across ranks in (DDP, FSDP2); "" in older files."""
    output_dtype: str = ""
    """The dtype of the model's outputs; "" in older files."""
    last_eval_step: int | None = None
    """The step of the run's last `--eval_freq` evaluation at or before this checkpoint; None when there was none."""
    last_eval: EvalAggregate | None = None
    """That evaluation's result."""


@dataclass
class MetricsRecord:
    """One reduced record per log step (means across ranks; timings are the max). A step with an
    `--eval_freq` evaluation always has a record, and its `eval` holds the result (None otherwise)."""

    version: int = METRICS_VERSION
    step: int = 0
    epoch: int = 0
    samples: int = 0
    loss: float = 0.0
    lr: float = 0.0
    grad_norm: float = 0.0
    update_s: float = 0.0
    dataloading_s: float = 0.0
    samples_per_s: float = 0.0
    mem_gb: float = 0.0
    info: dict[str, float] = field(default_factory=dict)
    eval: EvalAggregate | None = None


@dataclass
class RunStatus:
    version: int = FILES_VERSION
    status: RunState = "running"
    pid: int = 0
    hostname: str = ""
    started: str = ""
    updated: str = ""
    output_dir: str = ""
    job_name: str = ""
    step: int = 0
    steps: int = 0
    world_size: int = 1
    error: str | None = None


@dataclass
class FileDigest:
    """One checkpoint file as it was written: its size, SHA-256 (hex) and CRC-32 (zlib's,
    8 hex digits). `verify` checks both; resume checks the CRC-32, over twice as fast to
    compute, which catches the flipped and truncated bytes a check at load is for. An empty
    `crc32` (a file upgraded from version 1) means resume checks the SHA-256."""

    size: int = 0
    sha256: str = ""
    crc32: str = ""


@dataclass
class Checksums:
    """Every file of a checkpoint step folder (paths relative to it, `/`-separated) with its size,
    SHA-256 and CRC-32, taken when the save committed; verify and resume compare them to catch
    flipped or truncated bytes that parse fine. Its own version (`CHECKSUMS_VERSION`)."""

    version: int = CHECKSUMS_VERSION
    files: dict[str, FileDigest] = field(default_factory=dict)


def _checksums_from_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Version 1 had no `crc32`: its entries get an empty one (resume then checks SHA-256)."""
    files = data.get("files")
    if isinstance(files, dict):
        files = {name: {**entry, "crc32": ""} if isinstance(entry, dict) and "crc32" not in entry else entry for name, entry in files.items()}
    return {**data, "files": files, "version": 2}


ADAPTER_BASE_VERSION = 1


@dataclass
class AdapterBase:
    """The base model a LoRA folder's adapters were trained on (`adapter_base.json`): adapters
    mean something only on that base, and a base path may come to hold other weights (another
    run's `checkpoints/last/pretrained_model` moves on), so a resume compares `size` and `sha256`
    with the base at --policy.path. Its own version (`ADAPTER_BASE_VERSION`)."""

    version: int = ADAPTER_BASE_VERSION
    base_model_name_or_path: str = ""
    weights: str = "model.safetensors"
    """The base's weights file the digest is of, relative to the base folder."""
    size: int = 0
    sha256: str = ""

    def same_weights(self, other: AdapterBase) -> bool:
        return (self.weights, self.size, self.sha256) == (other.weights, other.size, other.sha256)


def save_adapter_base(path: Path, value: AdapterBase) -> None:
    save_json(path, to_dict(value))


def load_adapter_base(path: Path) -> AdapterBase:
    return load_json(path, AdapterBase, current_version=ADAPTER_BASE_VERSION)


def save_checksums(path: Path, value: Checksums) -> None:
    save_json(path, to_dict(value))


def load_checksums(path: Path) -> Checksums:
    """Read checksums.json; a version-1 file (before `crc32`) is upgraded."""
    return load_json(path, Checksums, current_version=CHECKSUMS_VERSION, upgrades={1: _checksums_from_v1})


def save_training_step(path: Path, value: TrainingStep) -> None:
    save_json(path, to_dict(value))


def _training_step_from_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Version 1 had no `epoch_offset`: None says the position is to be derived from `step`."""
    return {**data, "epoch_offset": None, "version": 2}


def _training_step_from_v2(data: dict[str, Any]) -> dict[str, Any]:
    """Version 2 did not record the effective dtypes: "" says they are not known."""
    return {"param_dtype": "", "reduce_dtype": "", "output_dtype": "", **data, "version": 3}


def _training_step_from_v3(data: dict[str, Any]) -> dict[str, Any]:
    """Version 3 had no evaluations during training."""
    return {"last_eval_step": None, "last_eval": None, **data, "version": 4}


def load_training_step(path: Path) -> TrainingStep:
    """Read training_step.json; older versions (before `epoch_offset`, the dtypes, the last eval) are upgraded."""
    return load_json(path, TrainingStep, current_version=TRAINING_STEP_VERSION,
                     upgrades={1: _training_step_from_v1, 2: _training_step_from_v2, 3: _training_step_from_v3})


def save_run_status(path: Path, value: RunStatus) -> None:
    save_json(path, to_dict(value))


def load_run_status(path: Path) -> RunStatus:
    return load_json(path, RunStatus, current_version=FILES_VERSION)


def read_metrics(path: Path) -> list[MetricsRecord]:
    """Every complete record of a metrics.jsonl (a partial last line is left for later)."""
    records: list[MetricsRecord] = []
    text = Path(path).read_text()
    lines = text.split("\n")
    if not text.endswith("\n"):
        lines = lines[:-1]
    for number, line in enumerate(lines, 1):
        if line.strip():
            records.append(parse_metrics_line(line, f"{path}:{number}"))
    return records


def parse_metrics_line(line: str | bytes, where: str) -> MetricsRecord:
    """One metrics.jsonl line as a record, strictly; a ConfigError naming `where` (file:line)
    when it is not valid JSON, not this version's record, or has unknown or missing keys."""
    try:
        data = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc})") from None
    if isinstance(data, dict) and data.get("version") == 1:  # version 1 had no evaluations
        data = {**data, "version": METRICS_VERSION, "eval": None}
    if not isinstance(data, dict) or data.get("version") != METRICS_VERSION:
        raise ConfigError(f"{where}: unsupported metrics record version")
    check_complete(MetricsRecord, data, where, what="metrics line")  # the engine writes every field
    return from_dict(MetricsRecord, data, source=where)


def holds_a_run(out: Path) -> bool:
    """Whether the folder `out` is already in use: it holds anything but what a launcher writes
    before the run starts (`logs/`, where lr-tui and Slurm send the output, and a `*.slurm`
    script). `lr-engine train` refuses such a folder without --resume, and lr-tui too."""
    out = Path(out)
    if not out.is_dir():
        return False
    return any(not (entry.name == "logs" and entry.is_dir()) and entry.suffix != ".slurm" for entry in out.iterdir())


def _train_config_from_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Version 1 had no `scheduler.decay_steps` (its decay always ended at --steps: None) and no
    dataset revision, video settings or image transforms (it read local image datasets only:
    the defaults describe that)."""
    upgraded = dict(data)
    if isinstance(data.get("scheduler"), dict):
        upgraded["scheduler"] = {"decay_steps": None, **data["scheduler"]}
    if isinstance(data.get("dataset"), dict):
        added = to_dict(DatasetConfig())
        upgraded["dataset"] = {key: added[key] for key in _DATASET_V2_KEYS} | data["dataset"]
    return {**upgraded, "version": 2}


_DATASET_V2_KEYS = ("revision", "video_backend", "tolerance_s", "image_transforms")


def _train_config_from_v2(data: dict[str, Any]) -> dict[str, Any]:
    """Version 2 had no evaluations during training: --eval_freq=0 (never) describes it."""
    return {"eval_freq": 0, "eval": to_dict(EvalConfig()), "env": to_dict(EvalEnvConfig()), **data, "version": 3}


def _train_config_from_v3(data: dict[str, Any]) -> dict[str, Any]:
    """Version 3's `act` was lr's own ACT (its layers and weights are not LeRobot's; its block has
    `backbone_channels`): refused by name. Policies gain `pretrained_revision` (unset: what they read)."""
    policy = data.get("policy")
    if isinstance(policy, dict):
        if policy.get("type") == "act" and "backbone_channels" in policy:
            raise ConfigError(
                "holds lr's earlier ACT (train_config version 3 or older), whose layers and weights are not LeRobot's ACT "
                "that `act` is now: it cannot be resumed or fine-tuned; start a new run with --policy.type=act"
            )
        data = {**data, "policy": {"pretrained_revision": None, **policy}}
    return {**data, "version": 4}


def _train_config_from_v4(data: dict[str, Any]) -> dict[str, Any]:
    """Version 4 had no `policy.dtype`: its policies trained in float32."""
    policy = data.get("policy")
    if isinstance(policy, dict):
        data = {**data, "policy": {"dtype": "float32", **policy}}
    return {**data, "version": 5}


def load_train_config(path: Path) -> TrainConfig:
    """Read a train_config.json (every field, unknown keys refused); versions 1 to 4 are upgraded."""
    try:
        return load_json(path, TrainConfig, current_version=TRAIN_CONFIG_VERSION,
                         upgrades={1: _train_config_from_v1, 2: _train_config_from_v2, 3: _train_config_from_v3,
                                   4: _train_config_from_v4})
    except ConfigError as exc:
        if str(exc).startswith("holds lr's earlier ACT"):
            raise ConfigError(f"{path} {exc}") from None
        raise
