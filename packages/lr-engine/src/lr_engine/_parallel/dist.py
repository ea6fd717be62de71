"""Process-group set-up and tear-down; the one place that reads the launcher's environment.

`init_distributed(cfg)` reads torchrun's variables (WORLD_SIZE, RANK, LOCAL_RANK,
LOCAL_WORLD_SIZE; `accelerate launch` goes through torchrun and sets the same), validates
the config for that world (exit 2 on a bad topology happens before any collective),
initializes gloo (CPU) or NCCL (CUDA) with a collective timeout, and builds the DeviceMesh
with named axes (`dp_replicate`, `dp_shard`). A single process gets no process group and
no mesh; everything else takes the same path on CPU and GPU.

`finish(code)` is the tear-down gloo needs on every rank (docs/architecture.md, measured facts): barrier, destroy the
process group, flush, `os._exit`. Without it gloo aborts at interpreter exit at random.
`abort(code)` is for a rank that failed: no collective (the others may be gone), exit now;
torchrun then stops the remaining ranks.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from datetime import timedelta

import torch
import torch.distributed as dist
from lr_config import ConfigError, Topology, TrainConfig, device_problem, load_training_step, resume_problems, validate
from lr_config.layout import StepFiles
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

DEFAULT_TIMEOUT_S = 300


@dataclass
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    topology: Topology
    device: torch.device
    mesh: DeviceMesh | None
    control_group: dist.ProcessGroup | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def dp_rank(self) -> int:
        """Rank along the flattened (dp_replicate, dp_shard) axes: the data slice."""
        return self.rank

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _mps_available() -> bool:
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def _xpu_available() -> bool:
    return hasattr(torch, "xpu") and torch.xpu.is_available()


def device_counts() -> dict[str, int]:
    """The devices this machine has, by kind (cpu always)."""
    counts = {"cpu": 1}
    if torch.cuda.is_available():
        counts["cuda"] = torch.cuda.device_count()
    if _mps_available():
        counts["mps"] = 1
    if _xpu_available():
        counts["xpu"] = torch.xpu.device_count()
    return counts


def requested_device(requested: str, local_rank: int) -> torch.device:
    """The device `--policy.device` names, checked against this machine: an unknown kind, a
    malformed index or a device it does not have is a ConfigError naming the flag (torch would
    raise a RuntimeError later, from inside the set-up)."""
    problem = device_problem(requested)  # validate refused it already; a caller may not have validated
    if problem:
        raise ConfigError(problem)
    kind, _, index_text = requested.partition(":")
    counts = device_counts()
    if kind not in counts:
        have = ", ".join(k if k in ("cpu", "mps") else f"{k} x{n}" for k, n in counts.items())
        raise ConfigError(
            f"--policy.device: {kind} is not available on this machine (it has: {have}); choose one of those, or leave "
            "--policy.device unset for the best one"
        )
    if kind in ("cpu", "mps"):
        return torch.device(kind)
    index = int(index_text) if index_text else local_rank
    if index >= counts[kind]:
        raise ConfigError(
            f"--policy.device: {kind}:{index} is not available on this machine (it has {counts[kind]} {kind} device"
            f"{'s' if counts[kind] != 1 else ''}, {kind}:0-{counts[kind] - 1}"
            + (f"; this process is local rank {local_rank}" if not index_text else "")
            + ")"
        )
    return torch.device(kind, index)


def precision_problem(precision: str, device: torch.device, bf16_supported: bool) -> str:
    """Why `--accelerator.mixed_precision` cannot run on `device` ("" when it can): a GPU before
    Ampere has no bf16 (torch would emulate it slowly, or fail inside a kernel)."""
    if precision == "bf16" and device.type == "cuda" and not bf16_supported:
        return (
            f"--accelerator.mixed_precision=bf16: {device} has no bf16 support; use --accelerator.mixed_precision=fp16 "
            "(with its loss scaler) or no"
        )
    return ""


def check_precision(precision: str, device: torch.device) -> None:
    supported = device.type != "cuda" or torch.cuda.is_bf16_supported(including_emulation=False)
    problem = precision_problem(precision, device, supported)
    if problem:
        raise ConfigError(problem)


def best_device(requested: str | None, local_rank: int) -> torch.device:
    """--policy.device (checked against this machine), else the best available: cuda, mps, xpu, cpu."""
    if requested:
        return requested_device(requested, local_rank)
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank)
    if _mps_available():
        return torch.device("mps")
    if _xpu_available():
        return torch.device("xpu", local_rank)
    return torch.device("cpu")


def launcher_world() -> tuple[int, int, int, int]:
    """(world_size, rank, local_rank, nnodes) from the launcher's environment."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    nnodes = max(1, world // max(1, local_world))
    return world, rank, local_rank, nnodes


def _resume_step_problems(cfg: TrainConfig) -> list[str]:
    """A resume's own problems (steps left, accumulation), from its checkpoint's training_step.json;
    none when that cannot be read yet (the resume itself then says why)."""
    if not cfg.resume or cfg.config_path is None:
        return []
    step_file = StepFiles.of_train_config(Path(cfg.config_path)).training_step
    try:
        return resume_problems(load_training_step(step_file).step, cfg)
    except ConfigError:
        return []


def validate_for_world(cfg: TrainConfig, world: int, nnodes: int) -> Topology:
    """`validate` for the launched world, with a resume's own problems, all in one ConfigError
    naming the flags (a resume's degrees come from its checkpoint, and the error says so)."""
    problems: list[str] = []
    topo = None
    try:
        topo = validate(cfg, world_size=world, nnodes=nnodes)
    except ConfigError as exc:
        problems += exc.problems
    problems += _resume_step_problems(cfg)
    if problems:
        head = problems[0] if len(problems) == 1 else f"{len(problems)} problems in the settings:\n  " + "\n  ".join(problems)
        if cfg.resume and any("--parallelism." in p for p in problems):
            head += ("\nThe degrees come from the checkpoint's train_config.json; to resume on another topology pass both "
                     "--parallelism.dp_replicate and --parallelism.dp_shard for this launch.")
        raise ConfigError(head, problems=problems)
    assert topo is not None
    return topo


def init_distributed(cfg: TrainConfig) -> DistContext:
    world, rank, local_rank, nnodes = launcher_world()
    topo = validate_for_world(cfg, world, nnodes)
    device = best_device(cfg.policy.device, local_rank)
    check_precision(cfg.accelerator.mixed_precision, device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    mesh: DeviceMesh | None = None
    control: dist.ProcessGroup | None = None
    if world > 1:
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = timedelta(seconds=float(os.environ.get("LR_DIST_TIMEOUT_S", DEFAULT_TIMEOUT_S)))
        dist.init_process_group(backend=backend, timeout=timeout, device_id=device if device.type == "cuda" else None)
        mesh = init_device_mesh(
            device.type,
            (topo.dp_replicate, topo.dp_shard),
            mesh_dim_names=("dp_replicate", "dp_shard"),
        )
        # Small host-side decisions (stop requests) go over gloo on every backend.
        control = dist.new_group(backend="gloo") if backend != "gloo" else dist.group.WORLD
    return DistContext(rank=rank, local_rank=local_rank, world_size=world, topology=topo, device=device, mesh=mesh, control_group=control)


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def finish(code: int) -> None:
    """Clean exit for every rank (see the module docstring). Never returns."""
    if dist.is_available() and dist.is_initialized():
        try:
            dist.barrier()
            dist.destroy_process_group()
        except Exception:  # a peer already failed; exit anyway, non-zero
            code = code or 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def abort(code: int) -> None:
    """Exit a failed rank now, without collectives. Never returns."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
