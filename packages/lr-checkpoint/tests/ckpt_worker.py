"""torchrun worker for the multi-process checkpoint tests (gloo, CPU).

    python -m torch.distributed.run --standalone --nproc-per-node=N ckpt_worker.py SCENARIO WORK_DIR

Scenarios group several checks per launch (start-up dominates): `fsdp2` (2 ranks; with
CRASH_AT=<pause point> it ends by pausing in a save, for the test to SIGKILL) and `hsdp`
(4 ranks, 2x2: loads the fsdp2 saves, and damaged copies of the gathered files).
Any failed assertion exits non-zero with its traceback; success prints `OK <scenario>`.
Every run ends with the teardown gloo needs (docs/architecture.md, measured facts).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).parent))

import lr_checkpoint as lc  # noqa: E402
from ckpt_toy import assert_matches, draw, make_model, make_optimizer, request, seed_all, shard_model, snapshot, train  # noqa: E402

FORMATS = ("safetensors", "dcp", "safetensors_dcp")


def fsdp(seed: int, mesh: object) -> torch.nn.Module:
    return shard_model(make_model(seed), mesh)


def save_formats(work: Path, mesh: object, rank: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = fsdp(0, mesh)
    optimizer = make_optimizer(model)
    train(model, optimizer, 3, rank)
    snapshot(work / "ref_fsdp.safetensors", model, optimizer, rank)
    for fmt in FORMATS:
        lc.save_checkpoint(work / f"fsdp_{fmt}" / "checkpoints", 3, request(model, optimizer, 3, fmt))
    return model, optimizer


def gathered_files_are_torchs_full_state(work: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int) -> None:
    """The gathered files, written tensor by tensor while the next one is gathered, hold exactly
    what torch's full state dict gathers: the same names, dtypes and bits."""
    from lr_checkpoint._state.state_dicts import full_model_state, full_optimizer_state, split_optimizer_state
    from safetensors.torch import load_file

    full_model = full_model_state(model)
    full_optimizer = full_optimizer_state(model, optimizer)
    if rank != 0:
        return
    del full_optimizer  # gathered too (a collective), but written as DCP shards in every format
    for fmt in ("safetensors", "safetensors_dcp"):
        step = work / f"fsdp_{fmt}" / "checkpoints" / "000003"
        files = [(step / "pretrained_model" / "model.safetensors", full_model)]
        for path, expected in files:
            got = load_file(str(path))
            assert sorted(got) == sorted(expected), (path, sorted(set(got) ^ set(expected)))
            for key, value in expected.items():
                assert got[key].dtype == value.dtype and torch.equal(got[key], value), (path, key)


def failed_gathered_write_fails_alike(work: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int) -> None:
    """A write that fails on the main rank halfway through the gathered model.safetensors (a file
    size limit there): every rank raises a CheckpointError naming the file and the cause, no
    collective is left waiting (the next save works), and nothing half-written is left."""
    import resource

    checkpoints = work / "gathered_full" / "checkpoints"
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    if rank == 0:
        model_bytes = (work / "fsdp_safetensors" / "checkpoints" / "000003" / "pretrained_model" / "model.safetensors").stat().st_size
        resource.setrlimit(resource.RLIMIT_FSIZE, (model_bytes // 2, limit[1]))
    try:
        lc.save_checkpoint(checkpoints, 4, request(model, optimizer, 4, "safetensors"))
    except lc.CheckpointError as exc:
        message = str(exc)
    else:
        raise AssertionError(f"rank {rank}: a save past the file size limit succeeded")
    finally:
        if rank == 0:
            resource.setrlimit(resource.RLIMIT_FSIZE, limit)
    assert "model.safetensors" in message and "File too large" in message, message
    dist.barrier()
    if rank == 0:
        assert not (checkpoints / "last").exists() and not (checkpoints / "000004").exists()
        leftovers = [p.name for p in checkpoints.rglob("*") if p.name.endswith(".tmp") or p.name == "model.safetensors"]
        assert leftovers == [], leftovers
    lc.save_checkpoint(checkpoints, 4, request(model, optimizer, 4, "safetensors"))
    if rank == 0:
        assert lc.verify_checkpoint(checkpoints / "last") == []


class _NoRoomOnTheHost(torch.Tensor):
    """A tensor whose copy to the CPU fails, as a gathered GPU tensor's does when host memory runs out."""

    def to(self, *args: object, **kwargs: object) -> torch.Tensor:  # type: ignore[override]
        raise MemoryError("no room for the copy")


def failed_copy_in_a_gather_fails_alike(work: Path, model: torch.nn.Module, rank: int) -> None:
    """Rank 0 fails to copy one tensor of the gathered file, between two tensors still to gather:
    it keeps gathering with the others (no rank waits forever in a gather), then every rank
    raises, and no file is left."""
    from lr_checkpoint._state.gathered import write_gathered
    from lr_checkpoint._state.state_dicts import local_model_state

    tensors = dict(local_model_state(model))
    odd = torch.ones(3)
    tensors["blocks.0.~odd"] = odd.as_subclass(_NoRoomOnTheHost) if rank == 0 else odd  # sorts before blocks.1.*
    folder = work / "failed_copy"
    if rank == 0:
        folder.mkdir()
    dist.barrier()
    try:
        write_gathered(folder / "model.safetensors", tensors, None, f"writing {folder / 'model.safetensors'}")
    except (MemoryError, lc.CheckpointError) as exc:
        message = str(exc)
    else:
        raise AssertionError(f"rank {rank}: the write succeeded")
    assert "no room for the copy" in message, message
    dist.barrier()
    if rank == 0:
        assert list(folder.iterdir()) == []


def load_formats(work: Path, mesh: object, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int) -> None:
    for fmt in FORMATS:
        fresh = fsdp(1, mesh)
        fresh_opt = make_optimizer(fresh)
        lc.load_model_and_optimizer(work / f"fsdp_{fmt}" / "checkpoints" / "last", fresh, fresh_opt)
        assert_matches(work / "ref_fsdp.safetensors", fresh, fresh_opt, f"fsdp2 {fmt} -> fsdp2")
    # The loaded state trains on exactly like the original.
    train(model, optimizer, 1, rank, seed=9)
    train(fresh, fresh_opt, 1, rank, seed=9)
    snapshot(work / "ref_after.safetensors", model, optimizer, rank)
    assert_matches(work / "ref_after.safetensors", fresh, fresh_opt, "one more step after loading")


def ddp_round_trips(work: Path, mesh: object, rank: int) -> None:
    model = DistributedDataParallel(make_model(2))
    optimizer = make_optimizer(model)
    train(model, optimizer, 3, rank)
    snapshot(work / "ref_ddp.safetensors", model, optimizer, rank)
    lc.save_checkpoint(work / "ddp" / "checkpoints", 3, request(model, optimizer, 3, "safetensors_dcp"))
    sharded = fsdp(3, mesh)
    sharded_opt = make_optimizer(sharded)
    lc.load_model_and_optimizer(work / "ddp" / "checkpoints", sharded, sharded_opt)
    assert_matches(work / "ref_ddp.safetensors", sharded, sharded_opt, "ddp-2 -> fsdp2-2")
    replicated = DistributedDataParallel(make_model(4))
    replicated_opt = make_optimizer(replicated)
    lc.load_model_and_optimizer(work / "fsdp_dcp" / "checkpoints", replicated, replicated_opt)
    assert_matches(work / "ref_fsdp.safetensors", replicated, replicated_opt, "fsdp2-2 dcp -> ddp-2")


def single_to_fsdp(work: Path, mesh: object) -> None:
    model = fsdp(5, mesh)
    optimizer = make_optimizer(model)
    lc.load_model_and_optimizer(work / "single" / "checkpoints", model, optimizer)
    assert_matches(work / "ref_single.safetensors", model, optimizer, "single -> fsdp2-2")


def keep_last_two(work: Path, mesh: object, rank: int) -> None:
    model = fsdp(6, mesh)
    optimizer = make_optimizer(model)
    for step in (4, 5, 6):
        train(model, optimizer, 1, rank)
        lc.save_checkpoint(work / "keep" / "checkpoints", step, request(model, optimizer, step, "dcp", keep=2))


def rng_round_trip(work: Path, mesh: object, rank: int) -> None:
    model = fsdp(7, mesh)
    optimizer = make_optimizer(model)
    seed_all(100 + rank)
    step_dir = lc.save_checkpoint(work / "rng" / "checkpoints", 1, request(model, optimizer, 1, "dcp"))
    expected = draw()
    assert lc.restore_rng(step_dir, rank)
    assert draw() == expected, "restored RNG draws differ"
    assert not lc.restore_rng(step_dir, 7)


def background_save(work: Path, mesh: object, rank: int) -> None:
    model = fsdp(8, mesh)
    optimizer = make_optimizer(model)
    train(model, optimizer, 2, rank)
    checkpoints = work / "async" / "checkpoints"
    step_dir = lc.save_checkpoint(checkpoints, 2, request(model, optimizer, 2, "safetensors_dcp", background=True))
    snapshot(work / "ref_async.safetensors", model, optimizer, rank)
    model(torch.randn(4, 18)).square().mean().backward()  # the loop keeps going until its optimizer step
    lc.wait_for_pending_save()
    assert step_dir.is_dir() and (checkpoints / "last").resolve() == step_dir.resolve()
    optimizer.step()
    fresh = fsdp(9, mesh)
    fresh_opt = make_optimizer(fresh)
    lc.load_model_and_optimizer(step_dir, fresh, fresh_opt)
    assert_matches(work / "ref_async.safetensors", fresh, fresh_opt, "async dcp save")


def crash_in_second_save(work: Path, mesh: object, rank: int) -> None:
    """Save step 1, then pause step 2's save where CRASH_AT says; the test SIGKILLs rank 0 there."""
    model = fsdp(0, mesh)
    optimizer = make_optimizer(model)
    train(model, optimizer, 1, rank)
    snapshot(work / "ref_crash.safetensors", model, optimizer, rank)
    lc.save_checkpoint(work / "crash" / "checkpoints", 1, request(model, optimizer, 1, "dcp"))
    train(model, optimizer, 1, rank)
    os.environ["LR_TEST_PAUSE_IN_SAVE"] = os.environ["CRASH_AT"]
    lc.save_checkpoint(work / "crash" / "checkpoints", 2, request(model, optimizer, 2, "dcp"))


def column_sharded_dcp(work: Path, mesh: object) -> None:
    """DCP shards lr never writes (tensor-parallel style: a weight split along dim 1, a
    bf16 weight split along dim 0 into uneven rows, a replicated int buffer), for the
    converter's DCP fallback. The full values are saved beside them for the test."""
    from torch.distributed.checkpoint.state_dict_saver import save
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    full = {
        "cols.weight": torch.arange(5 * 6, dtype=torch.float32).reshape(5, 6) / 7,
        "rows.weight": (torch.arange(3 * 4, dtype=torch.float32).reshape(3, 4) / 3).to(torch.bfloat16),
        "steps": torch.arange(4, dtype=torch.int64),
    }
    placements = {"cols.weight": Shard(1), "rows.weight": Shard(0), "steps": Replicate()}
    state = {key: distribute_tensor(value, mesh, [placements[key]]) for key, value in full.items()}
    save(state, checkpoint_id=str(work / "foreign" / "000001" / "pretrained_model" / "pytorch_model_fsdp_0"))
    if dist.get_rank() == 0:
        torch.save(full, work / "foreign_full.pt")


def scenario_fsdp2(work: Path, rank: int, world: int) -> None:
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp_shard",))
    column_sharded_dcp(work, mesh)
    model, optimizer = save_formats(work, mesh, rank)
    gathered_files_are_torchs_full_state(work, model, optimizer, rank)
    failed_gathered_write_fails_alike(work, model, optimizer, rank)
    failed_copy_in_a_gather_fails_alike(work, model, rank)
    load_formats(work, mesh, model, optimizer, rank)
    ddp_round_trips(work, mesh, rank)
    if (work / "single").exists():
        single_to_fsdp(work, mesh)
    keep_last_two(work, mesh, rank)
    rng_round_trip(work, mesh, rank)
    background_save(work, mesh, rank)
    if rank == 0:
        print("OK fsdp2", flush=True)
    if "CRASH_AT" in os.environ:
        crash_in_second_save(work, mesh, rank)


def damaged_gathered_files_fail_alike(work: Path, mesh: object, rank: int, world: int) -> None:
    """The gathered file that sharded ranks read by rows: a flipped byte in model.safetensors'
    tensor data (it still parses) and a truncated one are the same CheckpointError naming the
    file on every rank. (A sharded run's optimizer is DCP shards in every format.)"""
    import shutil
    import tempfile

    source = work / "fsdp_safetensors" / "checkpoints" / "000003"
    box: list[object] = [tempfile.mkdtemp(prefix="lr-damaged-") if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)  # copies outside the session's shared (read-only) runs
    scratch = Path(str(box[0]))
    flipped = scratch / "flip" / "000003"
    cut = scratch / "cut" / "000003"
    flipped_file = flipped / "pretrained_model" / "model.safetensors"
    model_file = cut / "pretrained_model" / "model.safetensors"
    if rank == 0:
        shutil.copytree(source, flipped)
        shutil.copytree(source, cut)
        with open(flipped_file, "r+b") as f:
            f.seek(flipped_file.stat().st_size - 8)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        os.truncate(model_file, model_file.stat().st_size - 4)
    dist.barrier()
    for folder, damaged, cause in ((flipped, flipped_file, "its checksum does not match"), (cut, model_file, "truncated")):
        model = fsdp(1, mesh)
        optimizer = make_optimizer(model)
        try:
            lc.load_model_and_optimizer(folder, model, optimizer)
        except lc.CheckpointError as exc:
            message = str(exc)
        else:
            raise AssertionError(f"rank {rank}: {damaged} loaded")
        assert str(damaged) in message and cause in message, message
        messages: list[object] = [None] * world
        dist.all_gather_object(messages, message)
        assert len(set(messages)) == 1, messages
    dist.barrier()
    if rank == 0:
        shutil.rmtree(scratch)


def scenario_hsdp(work: Path, rank: int, world: int) -> None:
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    for fmt in ("dcp", "safetensors"):
        model = fsdp(1, mesh)
        optimizer = make_optimizer(model)
        lc.load_model_and_optimizer(work / f"fsdp_{fmt}" / "checkpoints", model, optimizer)
        assert_matches(work / "ref_fsdp.safetensors", model, optimizer, f"fsdp2-2 {fmt} -> hsdp 2x2")
    damaged_gathered_files_fail_alike(work, mesh, rank, world)


SCENARIOS = {"fsdp2": scenario_fsdp2, "hsdp": scenario_hsdp}


def main() -> None:
    scenario, work = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    code = 0
    try:
        SCENARIOS[scenario](work, rank, world)
        if rank == 0 and scenario != "fsdp2":
            print(f"OK {scenario}", flush=True)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    if code == 0:
        dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
