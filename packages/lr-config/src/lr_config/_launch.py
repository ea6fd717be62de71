"""Launch commands, built from a `LaunchSpec` plus a `TrainConfig`.

The TUI and the docs use exactly this code. `build_launch` returns an argv list (never a
shell string); `format_command` renders it multi-line and copyable. The builder validates
that the parallel degrees fit the processes it will launch, so a command it prints never
fails at start-up on topology.

- torchrun: `torchrun --standalone --nproc-per-node=P -m lr_engine.cli train ...` on one
  node; `--nnodes/--node-rank/--rdzv-backend=c10d/--rdzv-endpoint/--rdzv-id` on several.
- accelerate (a plain launcher): `accelerate launch [--multi_gpu] --num_processes=W
  [--num_machines/--machine_rank/--main_process_ip/--main_process_port] --mixed_precision=X
  -m lr_engine.cli train ...`. The mixed precision is passed so that the variable
  accelerate exports agrees with the config and the environment guard lets it through.
- Slurm: `build_slurm_script` writes a batch script with one torchrun per node via srun.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any, Literal

from ._configs import TrainConfig, demo_act
from ._errors import ConfigError
from ._flags import _base_dict, _start_from_policy_path, _switch_policy_type, all_flag_paths
from ._serde import to_dict
from ._topology import Topology
from ._validate import validate

__all__ = ["LaunchSpec", "build_launch", "build_slurm_script", "config_to_flags", "format_command"]

ENTRY = ["-m", "lr_engine.cli", "train"]


@dataclass
class LaunchSpec:
    """How to start the processes (not what they train)."""

    launcher: Literal["torchrun", "accelerate"] = "torchrun"
    nnodes: int = 1
    node_rank: int = 0
    nproc_per_node: int = 1
    rdzv_endpoint: str | None = None
    rdzv_id: str = "lr"
    gpus_per_node: int | None = None
    time: str = "24:00:00"
    partition: str | None = None

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def check(self, *, require_endpoint: bool = True) -> None:
        """Raise ConfigError naming the launcher setting to change.

        A Slurm script finds the rendezvous host itself, so it passes
        `require_endpoint=False` (a given endpoint then only supplies the port).
        """
        if self.nnodes < 1:
            raise ConfigError(f"nnodes: must be >= 1, got {self.nnodes}")
        if self.nproc_per_node < 1:
            raise ConfigError(f"nproc_per_node: must be >= 1, got {self.nproc_per_node}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"node_rank: must be in [0, {self.nnodes - 1}] for {self.nnodes} nodes, got {self.node_rank}")
        host, _ = self.endpoint()
        if self.nnodes > 1 and require_endpoint:
            if not host:
                raise ConfigError("rdzv_endpoint: required with more than one node (HOST:PORT of node 0)")

    def endpoint(self) -> tuple[str, int]:
        text = self.rdzv_endpoint or ""
        if not text:
            return "", 29500
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"rdzv_endpoint: expected HOST:PORT, got {text!r}")
        return host, int(port)


def _flatten(data: dict[str, Any], leaves: set[str], prefix: str = "") -> dict[str, Any]:
    """Nested settings -> {flag path: value}, stopping at leaf flags (dict-valued ones too)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and path not in leaves:
            out.update(_flatten(value, leaves, path + "."))
        else:
            out[path] = value
    return out


def _flag_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def config_to_flags(cfg: TrainConfig) -> list[str]:
    """The `--a.b=value` flags that rebuild `cfg` with `parse_train_config` (only what differs).

    The base is the one the parser starts from: the defaults, or `cfg.config_path`'s file
    (read here), with the policy block swapped when `--policy.type` changes it, or taken
    from `--policy.path`'s config.json (read here) when that flag will be given. Without a
    file, the parser starts from the demo preset, or from a type's own defaults when
    `--policy.type` is given: of the two, the shorter list of flags is returned.
    """
    if cfg.config_path is None and cfg.policy.type_name == demo_act().type_name:
        from_preset = _flags_over(cfg, switch_type=False)
        typed = _flags_over(cfg, switch_type=True)
        return typed if len(typed) < len(from_preset) else from_preset
    return _flags_over(cfg, switch_type=None)


def _flags_over(cfg: TrainConfig, *, switch_type: bool | None) -> list[str]:
    """`switch_type`: give --policy.type (True), do not (False), or when the type differs from the base's (None)."""
    leaves = set(all_flag_paths(TrainConfig))
    config_path = None if cfg.config_path is None else str(cfg.config_path)
    base = _base_dict(config_path)
    flags = [] if config_path is None else [f"--config_path={config_path}"]
    policy_type = cfg.policy.type_name
    differs = base["policy"].get("type") != policy_type if switch_type is None else switch_type
    if differs:
        flags.append(f"--policy.type={policy_type}")
        _switch_policy_type(base, policy_type, fresh=config_path is None)
    policy_path = None if cfg.policy.path is None else str(cfg.policy.path)
    resuming = cfg.resume and config_path is not None  # the parser keeps the checkpoint's policy settings then
    if policy_path is not None and base["policy"].get("path") != policy_path and not resuming:  # it starts from its config.json
        _start_from_policy_path(base, {"policy.path": policy_path})
    defaults = _flatten(base, leaves)
    given = _flatten(to_dict(cfg), leaves)
    always = set()
    if config_path is not None and (given["dataset.repo_id"], given["dataset.root"]) != (defaults["dataset.repo_id"], defaults["dataset.root"]):
        # over a file, a new dataset resets the dataset folder and the policy's features unless
        # they are given (the parser's `_follow_a_new_dataset`): give them
        always = {"dataset.root", "policy.input_features", "policy.output_features"}
    for path, value in given.items():
        if path in ("policy.type", "config_path"):
            continue
        if path in always or path not in defaults or defaults[path] != value:
            flags.append(f"--{path}={_flag_value(value)}")
    return flags


def build_launch(spec: LaunchSpec, cfg: TrainConfig) -> list[str]:
    """argv that launches `lr-engine train` for `cfg` as `spec` says; validated first."""
    spec.check()
    validate(cfg, world_size=spec.world_size, nnodes=spec.nnodes)
    train = ENTRY + config_to_flags(cfg)
    if spec.launcher == "torchrun":
        return _torchrun(spec) + train
    return _accelerate(spec, cfg) + train


def _torchrun(spec: LaunchSpec, endpoint: str | None = None) -> list[str]:
    if spec.nnodes == 1:
        return ["torchrun", "--standalone", f"--nproc-per-node={spec.nproc_per_node}"]
    return [
        "torchrun",
        f"--nnodes={spec.nnodes}",
        f"--node-rank={spec.node_rank}",
        f"--nproc-per-node={spec.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint or spec.rdzv_endpoint}",
        f"--rdzv-id={spec.rdzv_id}",
    ]


def _accelerate(spec: LaunchSpec, cfg: TrainConfig) -> list[str]:
    argv = ["accelerate", "launch"]
    if spec.world_size > 1:
        argv.append("--multi_gpu")
    argv += [f"--num_processes={spec.world_size}", f"--mixed_precision={cfg.accelerator.mixed_precision}"]
    if spec.nnodes > 1:
        host, port = spec.endpoint()
        argv += [
            f"--num_machines={spec.nnodes}",
            f"--machine_rank={spec.node_rank}",
            f"--main_process_ip={host}",
            f"--main_process_port={port}",
        ]
    return argv


def format_command(argv: list[str]) -> str:
    """Multi-line, copy-pastable shell rendering: one launcher option or flag per line."""
    lines: list[str] = []
    for arg in argv:
        part = shlex.quote(arg)
        # Decide on the raw argument: a quoted flag ('--job_name=a b') starts a line too.
        if lines and (arg.startswith("--") or arg == "-m"):
            lines.append(part)
        elif lines:
            lines[-1] += " " + part
        else:
            lines.append(part)
    return " \\\n  ".join(lines)


def _script_line_value(flag: str, value: str) -> str:
    """`value`, which the script writes unquoted (#SBATCH lines, a comment): a line break there
    would start a shell command of its own, and sbatch ends a directive's value at a space or a
    '#' without applying shell quoting reliably, so the job would log somewhere else (or take
    another name) than the one asked for. Such values are refused, not quoted."""
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ConfigError(f"{flag}: {value!r} holds a line break or control character, which a Slurm script cannot carry safely")
    if any(c.isspace() or c == "#" for c in value):
        raise ConfigError(
            f"{flag}: {value!r} holds a space or '#', which a Slurm #SBATCH directive cannot hold "
            f"(sbatch would cut the value there); pass a {flag} without them"
        )
    return value


def build_slurm_script(spec: LaunchSpec, cfg: TrainConfig, topology: Topology | None = None) -> str:
    """A Slurm batch script: one torchrun per node via srun, rendezvous on the first node."""
    spec.check(require_endpoint=False)
    if spec.launcher != "torchrun":
        raise ConfigError("launcher: a Slurm script runs torchrun on each node; choose torchrun")
    if cfg.output_dir is None:
        raise ConfigError("--output_dir: required for a Slurm script (logs and checkpoints go there)")
    validate(cfg, world_size=spec.world_size, nnodes=spec.nnodes)
    _, port = spec.endpoint()
    out = _script_line_value("--output_dir", str(cfg.output_dir))
    gpus = spec.gpus_per_node if spec.gpus_per_node is not None else spec.nproc_per_node
    torchrun = [
        "torchrun",
        f"--nnodes={spec.nnodes}",
        f"--nproc-per-node={spec.nproc_per_node}",
        "--rdzv-backend=c10d",
        '--rdzv-endpoint="$LR_RDZV_ENDPOINT"',
        '--rdzv-id="$SLURM_JOB_ID"',
    ]
    train = " ".join(shlex.quote(a) for a in ENTRY + config_to_flags(cfg))
    job = _script_line_value("--job_name", cfg.job_name or cfg.policy.type_name)
    for name in ("partition", "time"):
        _script_line_value(name, getattr(spec, name) or "")
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job}",
        f"#SBATCH --nodes={spec.nnodes}",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --gpus-per-node={gpus}"] if gpus > 0 else []),
        f"#SBATCH --time={spec.time}",
        f"#SBATCH --output={out}/logs/slurm-%j.out",
        f"#SBATCH --error={out}/logs/slurm-%j.err",
    ]
    if spec.partition:
        lines.append(f"#SBATCH --partition={spec.partition}")
    lines += [
        "# Generated by lr-config. Slurm opens the log files before this runs: create",
        f"# {out}/logs before sbatch (lr-tui does).",
        "set -euo pipefail",
        "# sed reads all of scontrol's output: `head` would close the pipe early and pipefail would abort",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        f'export LR_RDZV_ENDPOINT="$head_node:{port}"',
        f"srun --nodes={spec.nnodes} --ntasks-per-node=1 " + " ".join(torchrun) + " " + train,
        "",
    ]
    return "\n".join(lines)
