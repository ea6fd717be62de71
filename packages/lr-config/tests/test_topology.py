"""Topology resolution for every world size 1..16, node-crossing axes, and batch arithmetic."""

from __future__ import annotations

import pytest

from lr_config import (
    ConfigError,
    ContextParallelConfig,
    ParallelismConfig,
    Topology,
    banner_line,
    effective_batch,
    parse_train_config,
    resolve_topology,
)

WORLDS = range(1, 17)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@pytest.mark.parametrize("world", WORLDS)
def test_no_parallelism_flags_is_ddp_over_every_process(world: int) -> None:
    topo = resolve_topology(ParallelismConfig(), world)
    assert (topo.dp_replicate, topo.dp_shard, topo.dp_world_size) == (world, 1, world)
    assert topo.layout == ("single" if world == 1 else "ddp")
    assert topo.sharded is False


@pytest.mark.parametrize("world", WORLDS)
def test_dp_shard_infer_is_fsdp2_over_every_process(world: int) -> None:
    topo = resolve_topology(ParallelismConfig(dp_shard=-1), world)
    assert (topo.dp_replicate, topo.dp_shard, topo.dp_world_size) == (1, world, world)
    assert topo.layout == ("single" if world == 1 else "fsdp2")
    assert topo.sharded is (world > 1)


@pytest.mark.parametrize("world", WORLDS)
def test_every_factorisation_resolves_to_its_layout(world: int) -> None:
    for rep in divisors(world):
        shard = world // rep
        topo = resolve_topology(ParallelismConfig(dp_replicate=rep, dp_shard=shard), world)
        assert (topo.dp_replicate, topo.dp_shard, topo.world_size) == (rep, shard, world)
        assert topo.dp_world_size == rep * shard == world
        expected = "single" if world == 1 else "ddp" if shard == 1 else "fsdp2" if rep == 1 else "hsdp"
        assert topo.layout == expected
        assert topo.sharded is (shard > 1)


@pytest.mark.parametrize("world", WORLDS)
def test_dp_shard_infer_next_to_a_replicate_degree(world: int) -> None:
    for rep in range(1, 17):
        par = ParallelismConfig(dp_replicate=rep, dp_shard=-1)
        if world % rep == 0:
            topo = resolve_topology(par, world)
            assert (topo.dp_replicate, topo.dp_shard) == (rep, world // rep)
        else:
            with pytest.raises(ConfigError) as err:
                resolve_topology(par, world)
            assert str(err.value).startswith("--parallelism.dp_shard=-1: cannot infer the shard degree")
            assert f"{world} processes are not divisible by --parallelism.dp_replicate={rep}" in str(err.value)


@pytest.mark.parametrize("world", WORLDS)
def test_degrees_that_do_not_multiply_to_the_world_are_refused_with_numbers(world: int) -> None:
    for rep in range(1, 17):
        for shard in range(1, 17):
            if rep * shard == world:
                continue
            with pytest.raises(ConfigError) as err:
                resolve_topology(ParallelismConfig(dp_replicate=rep, dp_shard=shard), world)
            message = str(err.value)
            assert f"--parallelism.dp_replicate x --parallelism.dp_shard = {rep} x {shard} = {rep * shard}" in message
            assert f"but {world} process" in message


@pytest.mark.parametrize("world", WORLDS)
def test_one_degree_alone(world: int) -> None:
    # dp_replicate alone is DDP only at the full world; dp_shard alone means dp_replicate=1.
    for degree in range(1, 17):
        for par in (ParallelismConfig(dp_replicate=degree), ParallelismConfig(dp_shard=degree)):
            if degree == world:
                topo = resolve_topology(par, world)
                assert topo.dp_world_size == world
                assert topo.dp_shard == (1 if par.dp_shard is None else world)
            else:
                with pytest.raises(ConfigError, match=f"= {degree}, but {world} process"):
                    resolve_topology(par, world)


@pytest.mark.parametrize("flag", ["dp_replicate", "dp_shard"])
@pytest.mark.parametrize("value", [0, -3])
def test_degrees_below_one_are_refused(flag: str, value: int) -> None:
    with pytest.raises(ConfigError, match=f"^--parallelism.{flag}: must be >= 1"):
        resolve_topology(ParallelismConfig(**{flag: value}), 4)


@pytest.mark.parametrize("cp", [ContextParallelConfig(ring_degree=2), ContextParallelConfig(ulysses_degree=4)])
def test_context_parallel_is_reserved(cp: ContextParallelConfig) -> None:
    with pytest.raises(ConfigError, match=r"^--parallelism.context_parallel.(ring|ulysses)_degree: .*must be 1"):
        resolve_topology(ParallelismConfig(context_parallel=cp), 4)


def test_world_and_nodes_must_fit() -> None:
    with pytest.raises(ConfigError, match="world size must be >= 1, got 0"):
        resolve_topology(ParallelismConfig(), 0)
    with pytest.raises(ConfigError, match="6 processes cannot be split evenly over 4 nodes"):
        resolve_topology(ParallelismConfig(), 6, nnodes=4)


# Multi-node: ranks are node-major and dp_shard is the innermost axis.


@pytest.mark.parametrize("world", WORLDS)
def test_replicate_across_nodes_shard_within(world: int) -> None:
    for nnodes in divisors(world):
        nproc = world // nnodes
        topo = resolve_topology(ParallelismConfig(dp_replicate=nnodes, dp_shard=nproc), world, nnodes=nnodes)
        assert topo.nproc_per_node == nproc
        assert topo.cross_node_axes() == (["dp_replicate"] if nnodes > 1 else [])


@pytest.mark.parametrize(
    ("rep", "shard", "nnodes", "expected"),
    [
        (8, 1, 2, ["dp_replicate"]),  # DDP over two nodes
        (1, 8, 2, ["dp_shard"]),  # FSDP2 over two nodes
        (4, 2, 2, ["dp_replicate"]),  # shard pairs stay on a node
        (2, 4, 4, ["dp_replicate", "dp_shard"]),  # a shard group of 4 spans two 2-process nodes
        (2, 2, 1, []),
    ],
)
def test_cross_node_axes(rep: int, shard: int, nnodes: int, expected: list[str]) -> None:
    topo = Topology(world_size=rep * shard, dp_replicate=rep, dp_shard=shard, nnodes=nnodes)
    assert topo.cross_node_axes() == expected


def test_describe_names_the_layout_and_the_node_crossing() -> None:
    topo = resolve_topology(ParallelismConfig(dp_replicate=2, dp_shard=4), 8, nnodes=2)
    assert topo.describe() == "HSDP dp_replicate=2 dp_shard=4 world=8 nodes=2x4 (across nodes: dp_replicate)"
    assert resolve_topology(ParallelismConfig(), 1).describe() == "single process dp_replicate=1 dp_shard=1 world=1"
    assert resolve_topology(ParallelismConfig(), 3).describe() == "DDP dp_replicate=3 dp_shard=1 world=3"


# Batch arithmetic


@pytest.mark.parametrize("world", WORLDS)
def test_effective_batch_is_the_product(world: int) -> None:
    for batch, accum in ((1, 1), (8, 4), (3, 7)):
        cfg = parse_train_config([f"--batch_size={batch}", f"--accelerator.gradient_accumulation.steps={accum}"])
        for par in (ParallelismConfig(), ParallelismConfig(dp_shard=-1)):
            topo = resolve_topology(par, world)
            assert effective_batch(cfg, topo) == batch * world * accum


def test_banner_line() -> None:
    cfg = parse_train_config(["--batch_size=8", "--accelerator.gradient_accumulation.steps=4", "--parallelism.dp_shard=-1"])
    topo = resolve_topology(cfg.parallelism, 2)
    assert banner_line(cfg, topo) == (
        "batch_size 8 x dp_world_size 2 x grad_accum 4 = effective batch 64 "
        "(topology: FSDP2 dp_replicate=1 dp_shard=2 world=2)"
    )


def test_banner_line_multi_node_hsdp() -> None:
    cfg = parse_train_config(["--batch_size=16", "--parallelism.dp_replicate=2", "--parallelism.dp_shard=4"])
    topo = resolve_topology(cfg.parallelism, 8, nnodes=2)
    assert banner_line(cfg, topo) == (
        "batch_size 16 x dp_world_size 8 x grad_accum 1 = effective batch 128 "
        "(topology: HSDP dp_replicate=2 dp_shard=4 world=8 nodes=2x4 (across nodes: dp_replicate))"
    )
