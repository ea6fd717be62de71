"""Engine overhead: the `lr-engine train` loop's steps/s against a bare torch loop.

    uv run python tools/bench/engine_overhead.py [--repeats=4] [--windows=6] [--smoke]

ACT at 10,560,322 parameters (see _act.py), batch 8 per process, AdamW, clipping at the
engine's default 10.0, no checkpoints, on CPU: single process, DDP-2 and FSDP2-2 (one
2-process launch with both). The engine's loop and the bare loop alternate step by step
inside the same processes (see _act.run_paired); each log window gives one ratio (the
first window, warm-up, is excluded); the result is the median of the window ratios.
Target: >= 0.97.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

TARGET = 0.97
SCRIPT = Path(__file__).resolve()


def _sizes(args: argparse.Namespace) -> dict[str, int]:
    if args.smoke:
        return {"batch": 4, "log_freq": 2, "steps": 6}
    return {"batch": args.batch_size, "log_freq": args.log_freq, "steps": args.log_freq * (1 + args.windows)}


def _flags(args: argparse.Namespace) -> list[str]:
    from _act import act_flags

    s = _sizes(args)
    return [*act_flags(args.smoke), f"--batch_size={s['batch']}", f"--steps={s['steps']}", f"--log_freq={s['log_freq']}",
            "--save_checkpoint=false", "--num_workers=0"]


# ---------------------------------------------------------------- worker (every rank)


def worker(args: argparse.Namespace) -> None:
    import _act

    flags = _flags(args)
    rows = []
    for repeat in range(args.repeats):
        for layout in args.layouts.split(","):
            res = _act.run_paired(flags, layout, Path(args.tmp) / f"engine-{layout}-{repeat}")
            if res is not None:
                rows += [{"repeat": repeat, "layout": layout, "window": i, "steps": n, "engine_s": e, "bare_s": b,
                          "parameters": res.parameters} for i, (n, e, b) in enumerate(res.windows, start=1)]
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        C.write_result(Path(args.result), rows)
    C.finish_worker(0)


# ---------------------------------------------------------------- parent


LAYOUT_NAMES = {"single": "single process", "ddp": "DDP-2 (gloo)", "fsdp2": "FSDP2-2 (gloo)"}


def _section(args: argparse.Namespace, rows: list[dict]) -> str:
    s = _sizes(args)
    body = [
        f"ACT, {rows[0]['parameters']:,} parameters (`{' '.join(_flags(args)[:6])}`), batch {s['batch']} per process, "
        f"AdamW, clipping at 10.0, CPU, OMP_NUM_THREADS=1 per process. Per repeat, the engine and the bare loop each run "
        f"{s['steps']} loop steps, alternating step by step in the same processes; times are summed per engine log window "
        f"of {s['log_freq']} steps and the first window is excluded. {args.repeats} repeats (fresh models each).",
        "",
    ]
    table_rows = []
    for layout in ("single", "ddp", "fsdp2"):
        mine = [r for r in rows if r["layout"] == layout]
        if not mine:
            continue
        ratios = [r["bare_s"] / r["engine_s"] for r in mine]
        steps = sum(r["steps"] for r in mine)
        engine_rate = steps / sum(r["engine_s"] for r in mine)
        bare_rate = steps / sum(r["bare_s"] for r in mine)
        table_rows.append([LAYOUT_NAMES[layout], f"{engine_rate:.3f}", f"{bare_rate:.3f}", f"{engine_rate / bare_rate:.3f}",
                           C.spread(ratios), f">= {TARGET}", C.verdict(C.median(ratios) >= TARGET)])
    body.append(C.table(["layout", "engine steps/s", "bare steps/s", "ratio of totals", "engine / bare per window",
                         "target", ""], table_rows))
    body += [
        "",
        "steps/s are totals over every steady window; the judged ratio is the median of the per-window ratios "
        "(`median (min-max, n=windows)`), each window comparing the two loops over the same seconds.",
        "",
        "How it is measured (`tools/bench/_act.py`): the engine runs its own loop (`lr_engine.build_run`, "
        "`start_files`, `train_loop`: what `lr-engine train` runs after parsing its flags, without the banner and the final "
        "model); its DataLoader is wrapped so that before handing over each batch the bare loop takes one step, timed "
        "apart. An engine window's time is read from its `metrics.jsonl` (`(update_s + dataloading_s) x steps`, the "
        "slowest rank) minus the bare steps inside it; the bare loop's time for that window is the sum of those bare "
        "steps. The bare loop is hand-written: the same policy, seed, dataset, normalizer, batch, AdamW hyper-parameters "
        "(fused) and global-norm clipping at 10.0, the same FSDP2 units, with its own DataLoader; no metrics, "
        "logging, LR schedule or checkpoints. The engine's windows follow each other without a gap, so each includes "
        "the previous log step's cost (one small all-gather, one JSON line, one print and a `run.json` update per "
        "window) and, every update, the non-blocking exchange of the stop flag.",
        "",
        "Per window (seconds per window of steps):",
        "",
        C.table(["repeat", "layout", "window", "engine s", "bare s", "engine / bare rate"],
                [[r["repeat"], r["layout"], r["window"], f"{r['engine_s']:.3f}", f"{r['bare_s']:.3f}",
                  f"{r['bare_s'] / r['engine_s']:.3f}"] for r in rows]),
    ]
    return "\n".join(body)


def main() -> None:
    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
        p.add_argument("--result", default="", help=argparse.SUPPRESS)
        p.add_argument("--tmp", default="", help=argparse.SUPPRESS)
        p.add_argument("--layouts", default="single", help=argparse.SUPPRESS)
        p.add_argument("--batch-size", type=int, default=8, help="per-process batch (default 8)")
        p.add_argument("--log-freq", type=int, default=4, help="loop steps per timing window (default 4)")
        p.add_argument("--windows", type=int, default=6, help="steady windows per run, after the warm-up window (default 6)")

    args = C.parse_args(__doc__.splitlines()[0], extra)
    args.repeats = args.repeats or (1 if args.smoke else 4)
    if args.worker:
        worker(args)
        return
    ctx = C.Context.now()
    passed = [f"--repeats={args.repeats}"] + ([] if args.smoke else [f"--batch-size={args.batch_size}", f"--log-freq={args.log_freq}", f"--windows={args.windows}"])
    with tempfile.TemporaryDirectory(prefix="lr-bench-overhead-") as tmp:
        rows = []
        for nproc, layouts in ((1, "single"), (2, "ddp,fsdp2")):
            argv = [*passed, f"--tmp={tmp}", f"--layouts={layouts}"] + (["--smoke"] if args.smoke else [])
            rows += C.run_worker(nproc, SCRIPT, argv, Path(tmp) / f"result-{nproc}.json", timeout=1800)
    C.write_section(args.out, "engine_overhead", "1. Engine overhead: `lr-engine train` loop vs a bare torch loop (CPU)",
                    C.command_line("engine_overhead.py", args, [] if args.smoke else passed), ctx, _section(args, rows), args.smoke)


if __name__ == "__main__":
    main()
