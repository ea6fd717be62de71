"""Topology and batch arithmetic.

`dp_replicate x dp_shard = world size`. No `--parallelism.*` on a multi-process launch is
DDP (`dp_replicate = world`); `dp_shard = -1` infers the shard degree; an unset
`dp_replicate` next to a set `dp_shard` is 1. Nothing is ever guessed silently beyond
those rules: degrees that do not multiply to the world size are an error with numbers.

`effective_batch = batch_size x dp_world_size x grad_accum_steps`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._configs import ParallelismConfig, TrainConfig
from ._errors import ConfigError

__all__ = ["Topology", "banner_line", "effective_batch", "resolve_topology"]


@dataclass(frozen=True)
class Topology:
    """A resolved data-parallel layout. Mesh axes: (dp_replicate, dp_shard)."""

    world_size: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    nnodes: int = 1

    @property
    def dp_world_size(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def sharded(self) -> bool:
        return self.dp_shard > 1

    @property
    def layout(self) -> str:
        """single, ddp, fsdp2 or hsdp."""
        if self.world_size == 1:
            return "single"
        if self.dp_shard == 1:
            return "ddp"
        if self.dp_replicate == 1:
            return "fsdp2"
        return "hsdp"

    @property
    def nproc_per_node(self) -> int:
        return self.world_size // self.nnodes

    def cross_node_axes(self) -> list[str]:
        """Mesh axes with a group that spans nodes (ranks are node-major, dp_shard innermost)."""
        per_node = self.nproc_per_node

        def crosses(groups: list[list[int]]) -> bool:
            return any(len({rank // per_node for rank in group}) > 1 for group in groups)

        shard_groups = [[r * self.dp_shard + s for s in range(self.dp_shard)] for r in range(self.dp_replicate)]
        rep_groups = [[r * self.dp_shard + s for r in range(self.dp_replicate)] for s in range(self.dp_shard)]
        return [name for name, groups in (("dp_replicate", rep_groups), ("dp_shard", shard_groups)) if crosses(groups)]

    def describe(self) -> str:
        name = {"single": "single process", "ddp": "DDP", "fsdp2": "FSDP2", "hsdp": "HSDP"}[self.layout]
        text = f"{name} dp_replicate={self.dp_replicate} dp_shard={self.dp_shard} world={self.world_size}"
        if self.nnodes > 1:
            axes = self.cross_node_axes()
            text += f" nodes={self.nnodes}x{self.nproc_per_node}"
            text += f" (across nodes: {', '.join(axes) if axes else 'none'})"
        return text


def _check_degree(name: str, value: int | None, *, allow_infer: bool = False) -> None:
    if value is None or (allow_infer and value == -1):
        return
    if value < 1:
        extra = " (or -1 to infer it from the launcher)" if allow_infer else ""
        raise ConfigError(f"--parallelism.{name}: must be >= 1{extra}, got {value}")


def _check_degrees(par: ParallelismConfig) -> None:
    """The checks that need no world size: reserved axes are 1, set degrees are >= 1 (or -1)."""
    cp = par.context_parallel
    for name, value in (("ring_degree", cp.ring_degree), ("ulysses_degree", cp.ulysses_degree)):
        if value != 1:
            raise ConfigError(f"--parallelism.context_parallel.{name}: context parallelism is reserved; must be 1, got {value}")
    _check_degree("dp_replicate", par.dp_replicate)
    _check_degree("dp_shard", par.dp_shard, allow_infer=True)


def resolve_topology(par: ParallelismConfig, world_size: int, nnodes: int = 1) -> Topology:
    """Resolve the degrees for `world_size` processes, or raise naming the flags to change."""
    _check_degrees(par)
    if world_size < 1:
        raise ConfigError(f"world size must be >= 1, got {world_size}")
    if nnodes < 1 or world_size % nnodes:
        raise ConfigError(f"{world_size} processes cannot be split evenly over {nnodes} nodes")
    rep, shard = par.dp_replicate, par.dp_shard
    if rep is None and shard is None:
        rep, shard = world_size, 1
    elif shard == -1:
        rep = rep or 1
        if world_size % rep:
            raise ConfigError(
                f"--parallelism.dp_shard=-1: cannot infer the shard degree, {world_size} processes "
                f"are not divisible by --parallelism.dp_replicate={rep}"
            )
        shard = world_size // rep
    rep = rep or 1
    shard = shard or 1
    if rep * shard != world_size:
        example = (
            "for example --parallelism.dp_shard=-1"
            if world_size % rep == 0
            else f"for example --parallelism.dp_replicate=1 --parallelism.dp_shard={world_size}"
        )
        raise ConfigError(
            f"--parallelism.dp_replicate x --parallelism.dp_shard = {rep} x {shard} = {rep * shard}, "
            f"but {world_size} process{'es' if world_size != 1 else ''} will run; make the product {world_size} "
            f"({example}) or launch {rep * shard} processes"
        )
    return Topology(world_size=world_size, dp_replicate=rep, dp_shard=shard, nnodes=nnodes)


def effective_batch(cfg: TrainConfig, topo: Topology) -> int:
    return cfg.batch_size * topo.dp_world_size * cfg.grad_accum_steps


def banner_line(cfg: TrainConfig, topo: Topology) -> str:
    """`batch_size x dp_world_size x grad_accum = effective (topology: ...)`."""
    return (
        f"batch_size {cfg.batch_size} x dp_world_size {topo.dp_world_size} x grad_accum "
        f"{cfg.grad_accum_steps} = effective batch {effective_batch(cfg, topo)} "
        f"(topology: {topo.describe()})"
    )
