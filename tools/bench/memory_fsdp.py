"""Memory per rank under FSDP2: parameter, gradient and optimizer bytes, N = 2 and 4.

    uv run python tools/bench/memory_fsdp.py [--smoke]

The engine builds the run exactly as `lr-engine train` does (`lr_engine.build_run`:
policy, FSDP2 wrapping, AdamW) and takes one loop step with its own `forward_backward`
and `update`. Inside each rank: gradient bytes right after the backward (once FSDP2's
reduce-scatter has left the sharded gradients), parameter and optimizer-state bytes
after the update. Each is counted two ways: the local shards' numel x element size, and
the bytes of the distinct storages behind them (FSDP2 pads uneven shards). The same
measurement in one process gives the single-process total. Target: the largest rank
holds <= 1.05/N of the total (plus ignored modules; this run ignores none).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

TOLERANCE = 1.05
SCRIPT = Path(__file__).resolve()
KINDS = ("params", "grads", "optimizer")


# ---------------------------------------------------------------- worker (every rank)


def _local(t: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _bytes(tensors: list[Any]) -> dict[str, int]:
    """Local shard bytes, and the bytes of the distinct storages holding them."""
    locals_ = [_local(t) for t in tensors]
    storages = {}
    for t in locals_:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return {"local": sum(t.numel() * t.element_size() for t in locals_), "storage": sum(storages.values())}


def _optimizer_tensors(optimizer: Any) -> list[Any]:
    import torch

    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    from _act import act_flags, train_config
    from lr_engine import batches, build_run, forward_backward, init_distributed, update

    flags = [*act_flags(args.smoke), "--batch_size=4", "--steps=1", "--save_checkpoint=false", f"--output_dir={args.tmp}/run"]
    if args.sharded:
        flags.append("--parallelism.dp_shard=-1")
    cfg = train_config(flags)
    ctx = init_distributed(cfg)
    run = build_run(cfg, ctx)
    run.model.train()
    batch, _ = next(batches(run))
    forward_backward(run, batch, last_micro=True)
    params = [p for p in run.model.parameters() if p.requires_grad]
    measured = {"grads": _bytes([p.grad for p in params if p.grad is not None])}
    update(run, 0)
    measured["params"] = _bytes(list(run.model.parameters()))
    measured["optimizer"] = _bytes(_optimizer_tensors(run.optimizer))
    measured["parameters"] = sum(p.numel() for p in run.policy.parameters())  # type: ignore[assignment]
    measured["ignored"] = len(run.plan.ignored) if run.plan is not None else 0  # type: ignore[assignment]
    everyone = [None] * ctx.world_size if ctx.is_main else None
    if dist.is_initialized():
        dist.gather_object(measured, everyone, dst=0)
    else:
        everyone = [measured]
    if ctx.is_main:
        C.write_result(Path(args.result), everyone)
    C.finish_worker(0)


# ---------------------------------------------------------------- parent


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f}"


def _section(single: dict[str, Any], runs: dict[int, list[dict[str, Any]]]) -> tuple[str, bool]:
    total = {k: single[k]["local"] for k in KINDS}
    all_total = sum(total.values())
    rows = [["1 (total)", "-", *(_mb(total[k]) for k in KINDS), _mb(all_total), "1.000", "-", "-", ""]]
    ok_all = True
    for n, ranks in sorted(runs.items()):
        for r, rank in enumerate(ranks):
            local = sum(rank[k]["local"] for k in KINDS)
            storage = sum(rank[k]["storage"] for k in KINDS)
            ok = storage <= TOLERANCE / n * all_total and local <= TOLERANCE / n * all_total
            ok_all &= ok
            rows.append([str(n), str(r), *(_mb(rank[k]["local"]) for k in KINDS), _mb(local), f"{local / all_total:.4f}",
                         f"{storage / all_total:.4f}", f"<= {TOLERANCE / n:.4f}", C.verdict(ok)])
    body = [
        f"ACT with {single['parameters']:,} parameters, AdamW (fp32: parameters, gradients, exp_avg, exp_avg_sq and a "
        "step scalar per parameter), FSDP2 over the policy's ACTEncoderLayer/ACTDecoderLayer units then the root, no "
        "ignored modules (ignored module bytes: 0). MB = 10^6 bytes of local shards (numel x element size); the storage "
        "column counts the distinct storages behind the shards, FSDP2's padding included.",
        "",
        C.table(["N", "rank", "params MB", "grads MB", "optimizer MB", "sum MB", "sum / total", "storage / total", "target", ""], rows),
        "",
        "Not counted (outside the target's definition): the transient full parameters of the unit being computed "
        "(FSDP2 all-gathers one unit at a time and frees it after its forward and backward), activations, and "
        "communication buffers.",
    ]
    return "\n".join(body), ok_all


def main() -> None:
    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
        p.add_argument("--result", default="", help=argparse.SUPPRESS)
        p.add_argument("--tmp", default="", help=argparse.SUPPRESS)
        p.add_argument("--sharded", action="store_true", help=argparse.SUPPRESS)

    args = C.parse_args(__doc__.splitlines()[0], extra)
    if args.worker:
        worker(args)
        return
    ctx = C.Context.now()
    sizes = [2] if args.smoke else [2, 4]
    smoke = ["--smoke"] if args.smoke else []
    with tempfile.TemporaryDirectory(prefix="lr-bench-memory-") as tmp:
        single = C.run_worker(1, SCRIPT, [*smoke, f"--tmp={tmp}/1"], Path(tmp) / "single.json", timeout=900)[0]
        runs = {n: C.run_worker(n, SCRIPT, [*smoke, "--sharded", f"--tmp={tmp}/{n}"], Path(tmp) / f"fsdp{n}.json", timeout=900) for n in sizes}
    body, _ = _section(single, runs)
    C.write_section(args.out, "memory_fsdp", "2. Memory per rank under FSDP2 (CPU, gloo)", C.command_line("memory_fsdp.py", args), ctx, body, args.smoke)


if __name__ == "__main__":
    main()
