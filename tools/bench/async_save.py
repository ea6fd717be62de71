"""Async save: the training loop's blocked time per save, `checkpoint_async` against sync.

    uv run python tools/bench/async_save.py [--repeats=3] [--smoke]

Two FSDP2 processes train the 201 MB model of checkpoint_io.py (AdamW; 604 MB of
model and optimizer state in all) and save in the `dcp` format at an update boundary,
as the engine does, then run the next loop step. Per save, on every rank:
- `call`: `save_checkpoint(...)` until it returns;
- `wait`: `wait_for_staging()` before the next `optimizer.step()` (lr-checkpoint's
  contract, and what the engine's `update()` does: the background copy reads the live
  parameters and optimizer state, so the update must not start before it is done); 0 for
  a synchronous save;
- blocked = call + wait; the next step's forward and backward run in between, overlapping
  the background write;
- `commit wait`: `wait_for_pending_save()` right after that optimizer step: what a save
  (or the end of training) would still wait for the background writes and commit
  (checksums, fsync, rename, `last`) if it came then; the engine's next save comes
  `save_freq` steps later.
Sync and async saves alternate (sync first on even repeats); one untimed save of each
kind comes first (it creates the background process groups). Times are the main rank's,
between barriers. Target: async blocked <= 0.1 x sync blocked.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

TARGET = 0.1
SCRIPT = Path(__file__).resolve()


def async_supported() -> str | None:
    """None when lr_checkpoint can save DCP in the background, else why not."""
    try:
        import lr_checkpoint
        from lr_checkpoint import _save
    except ImportError as exc:
        return f"lr_checkpoint cannot be imported ({exc})"
    if not hasattr(lr_checkpoint, "wait_for_pending_save") or "checkpoint_async" not in Path(_save.__file__).read_text():
        return "lr_checkpoint does not implement checkpoint_async (no background DCP save in _save.py)"
    return None


# ---------------------------------------------------------------- worker (every rank)


def _barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def one_save(background: bool, step: int, model: Any, optimizer: Any, root: Path, dim: int, batch: int, main: bool) -> dict[str, Any]:
    import torch
    from _stack import save_request
    from lr_checkpoint import save_checkpoint, wait_for_pending_save, wait_for_staging

    ckpts = root / ("async" if background else "sync")
    x = torch.randn(batch, dim)
    _barrier()
    t0 = C.now()
    save_checkpoint(ckpts, step, save_request(model, optimizer, step, "dcp", background=background))
    t1 = C.now()
    model(x).square().mean().backward()  # the next loop step's forward and backward
    t2 = C.now()
    wait_for_staging()
    t3 = C.now()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    t4 = C.now()
    wait_for_pending_save()
    t5 = C.now()
    _barrier()
    if main:
        shutil.rmtree(ckpts)
    _barrier()
    return {"mode": "async" if background else "sync", "call_s": t1 - t0, "compute_s": t2 - t1, "wait_s": t3 - t2, "commit_wait_s": t5 - t4}


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import _stack

    dist.init_process_group("gloo")
    main = dist.get_rank() == 0
    size = _stack.SMOKE if args.smoke else _stack.FULL
    model, optimizer = _stack.build(size, distributed=True)
    root = Path(args.tmp)
    root.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(1 + dist.get_rank())
    batch = 4 if args.smoke else args.batch
    step = 0
    rows = []
    for warm in (False, True):
        step += 1
        one_save(warm, step, model, optimizer, root, size["dim"], batch, main)
    for repeat in range(args.repeats):
        for background in ((False, True) if repeat % 2 == 0 else (True, False)):
            step += 1
            rows.append({"repeat": repeat, **one_save(background, step, model, optimizer, root, size["dim"], batch, main)})
    if main:
        C.write_result(Path(args.result), {"model_bytes": _stack.model_bytes(model), "size": size, "batch": batch, "rows": rows})
    C.finish_worker(0)


# ---------------------------------------------------------------- parent


def _section(result: dict[str, Any], repeats: int) -> str:
    rows = result["rows"]
    sync = {r["repeat"]: r for r in rows if r["mode"] == "sync"}
    asyn = {r["repeat"]: r for r in rows if r["mode"] == "async"}
    blocked = {k: {rep: r["call_s"] + r["wait_s"] for rep, r in d.items()} for k, d in (("sync", sync), ("async", asyn))}
    ratio = [blocked["async"][rep] / blocked["sync"][rep] for rep in sync]
    call_ratio = [asyn[rep]["call_s"] / blocked["sync"][rep] for rep in sync]
    size = result["size"]
    table_rows = [
        ["sync", C.spread([r["call_s"] for r in sync.values()]), "0", C.spread(list(blocked["sync"].values())), "1", "-", "", "0"],
        ["async", C.spread([r["call_s"] for r in asyn.values()]), C.spread([r["wait_s"] for r in asyn.values()]),
         C.spread(list(blocked["async"].values())), C.spread(ratio), f"<= {TARGET}", C.verdict(C.median(ratio) <= TARGET),
         C.spread([r.get("commit_wait_s", 0.0) for r in asyn.values()])],
    ]
    body = [
        f"FSDP2-2 on CPU (gloo), {result['model_bytes'] / 1e6:.1f} MB model ({size['blocks']} x Linear({size['dim']}, {size['dim']})) "
        f"with AdamW state, format `dcp`; the next step's forward and backward (batch {result['batch']} per rank) took "
        f"{C.spread([r['compute_s'] for r in rows])} s. {repeats} interleaved repeats, seconds.",
        "",
        C.table(["save", "call s", "wait before next optimizer.step s", "blocked s", "blocked / sync", "target", "", "commit wait after that step s"], table_rows),
        "",
        "The engine waits the same way: its `update()` calls `wait_for_staging` before the optimizer step that "
        "follows an async save, after that step's forward and backward; the writes and the commit (checksums, fsync, "
        "rename, `last`) run in background threads on every rank, and the next save or the end of training waits for "
        "them (`wait_for_pending_save`; the last column is that wait right after the optimizer step). The call alone is "
        f"{C.spread(call_ratio)} of a sync save; not waiting is not an option, since the background staging reads the "
        "live tensors and updating them before it is done can tear the checkpoint (docs/architecture.md, measured facts).",
        "",
        "Per repeat (s): " + "; ".join(
            f"#{rep}: sync {blocked['sync'][rep]:.2f}, async call {asyn[rep]['call_s']:.2f} + wait {asyn[rep]['wait_s']:.2f}"
            for rep in sorted(sync)) + ".",
    ]
    return "\n".join(body)


def main() -> None:
    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
        p.add_argument("--result", default="", help=argparse.SUPPRESS)
        p.add_argument("--tmp", default="", help=argparse.SUPPRESS)
        p.add_argument("--batch", type=int, default=32, help="rows per rank in the step after each save (default 32)")

    args = C.parse_args(__doc__.splitlines()[0], extra)
    args.repeats = args.repeats or (1 if args.smoke else 3)
    if args.worker:
        worker(args)
        return
    ctx = C.Context.now()
    title = "4. Async save: blocked time of the training loop per save"
    missing = async_supported()
    if missing is not None:
        print(f"async save: not implemented: {missing}")
        C.write_section(args.out, "async_save", title, C.command_line("async_save.py", args), ctx,
                        f"Not implemented: {missing}. Nothing was measured.", args.smoke)
        return
    argv = [f"--repeats={args.repeats}", f"--batch={args.batch}"] + (["--smoke"] if args.smoke else [])
    with tempfile.TemporaryDirectory(prefix="lr-bench-async-") as tmp:
        result = C.run_worker(2, SCRIPT, [*argv, f"--tmp={tmp}/ck"], Path(tmp) / "r.json", timeout=1800)
    flags = [] if args.smoke else [f"--repeats={args.repeats}"]
    C.write_section(args.out, "async_save", title, C.command_line("async_save.py", args, flags), ctx, _section(result, args.repeats), args.smoke)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
