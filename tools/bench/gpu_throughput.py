"""GPU: ACT bf16 samples/s and peak memory at several batch sizes, engine and bare loop.

    uv run python tools/bench/gpu_throughput.py [--repeats=3] [--batch-sizes=8,64,512,2048]

Single process on `cuda:0`: the ACT of engine_overhead.py (10,560,322 parameters) with
`--accelerator.mixed_precision=bf16` (autocast), AdamW, through the engine's loop and
through the bare loop of `_act.py`, interleaved per batch size, on the demo task generated
with enough episodes for the largest batch (`_dataset`). samples/s is the steady
state (first log window excluded); peak memory is `torch.cuda.max_memory_allocated`,
reset before each run. Without CUDA it writes a section saying it was not measured and
exits 0. `--device=cpu` runs the same code on the CPU (a check that the script works,
not a GPU measurement).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

SCRIPT = Path(__file__).resolve()
TITLE = "7. GPU: ACT bf16 throughput and peak memory (single process)"


BATCHES_PER_EPOCH = 8  # at the largest batch size: the epoch boundary (a new sampler pass) stays a small part of a run


def _flags(args: argparse.Namespace, batch: int, dataset: Path) -> list[str]:
    from _act import act_flags

    log_freq = 2 if args.smoke else args.log_freq
    steps = log_freq * (2 if args.smoke else 1 + args.windows)
    return [*act_flags(args.smoke), "--accelerator.mixed_precision=bf16", f"--batch_size={batch}", f"--steps={steps}",
            f"--log_freq={log_freq}", "--save_checkpoint=false", f"--num_workers={args.num_workers}", f"--policy.device={args.device}",
            f"--dataset.root={dataset}"]


def _dataset(root: Path, largest_batch: int) -> tuple[Path, int, int]:
    """The demo task with enough episodes for BATCHES_PER_EPOCH batches of the largest size
    (the shipped demo's 2399 frames make one batch of 2048 and no more): (root, episodes, frames)."""
    import json
    import shutil

    from lr_engine import make_demo_dataset

    episodes = 40
    while True:
        make_demo_dataset(root, num_episodes=episodes)
        frames = int(json.loads((root / "meta" / "info.json").read_text())["total_frames"])
        if frames >= BATCHES_PER_EPOCH * largest_batch:
            return root, episodes, frames
        shutil.rmtree(root)
        episodes = -(-episodes * BATCHES_PER_EPOCH * largest_batch // frames)  # episodes vary in length: checked again


def worker(args: argparse.Namespace) -> None:
    import _act
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        C.write_result(Path(args.result), {"skipped": "no CUDA device (torch.cuda.is_available() is False)"})
        C.finish_worker(0)
    rows: list[dict[str, Any]] = []
    batches = [int(b) for b in args.batch_sizes.split(",")]
    dataset, episodes, frames = _dataset(Path(args.tmp) / "dataset", max(batches))
    for repeat in range(args.repeats):
        for batch in batches:
            flags = _flags(args, batch, dataset)
            for kind in ("engine", "bare") if repeat % 2 == 0 else ("bare", "engine"):
                row: dict[str, Any] = {"repeat": repeat, "batch": batch, "kind": kind}
                try:
                    res: Any = (_act.run_engine(flags, "single", Path(args.tmp) / f"{kind}-{batch}-{repeat}") if kind == "engine"
                                else _act.run_bare(flags, "single"))
                    rate, _ = _act.steady_rate(res.windows)
                    # peak memory is torch.cuda.max_memory_allocated; the CPU check has no equivalent
                    row.update(samples_per_s=rate * batch, mem_gb=res.mem_gb if args.device == "cuda" else None)
                except torch.OutOfMemoryError:
                    row["oom"] = True
                    torch.cuda.empty_cache()
                rows.append(row)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU (code-path check, not a GPU measurement)"
    C.write_result(Path(args.result), {"device": name, "rows": rows, "episodes": episodes, "frames": frames})
    C.finish_worker(0)


def _section(res: dict[str, Any], args: argparse.Namespace) -> str:
    if "skipped" in res:
        return (f"**Not measured in this run**: {res['skipped']}. On a machine with a CUDA GPU, this command fills the "
                f"section: `uv run python tools/bench/gpu_throughput.py` (ACT at 10,560,322 parameters, bf16 autocast, "
                f"batch sizes {args.batch_sizes}, engine loop and bare loop interleaved, samples/s and peak "
                "`torch.cuda.max_memory_allocated`); on a GPU machine without uv or network, "
                "`bash tools/bench/gpu_device.sh run` (its header says how).")
    rows = res["rows"]
    out = []
    for batch in sorted({r["batch"] for r in rows}):
        cells = [str(batch)]
        rates = {}
        for kind in ("engine", "bare"):
            mine = [r for r in rows if r["batch"] == batch and r["kind"] == kind]
            if any(r.get("oom") for r in mine):
                cells += ["OOM", "OOM"]
                continue
            rates[kind] = [r["samples_per_s"] for r in mine]
            mem = [r["mem_gb"] for r in mine if r["mem_gb"] is not None]
            cells += [C.spread(rates[kind], "{:.0f}"), C.spread(mem, "{:.2f}") if mem else "-"]
        ratio = [e / b for e, b in zip(rates.get("engine", []), rates.get("bare", []))]
        cells.append(C.spread(ratio) if ratio else "-")
        out.append(cells)
    return "\n".join([
        f"Device: {res['device']}. {args.repeats} interleaved repeats; samples/s over the steady windows; memory in GB (10^9 bytes). "
        f"Data: the demo task generated with {res['episodes']} episodes ({res['frames']:,} frames, at least {BATCHES_PER_EPOCH} "
        f"batches of the largest size per epoch), {args.num_workers} DataLoader workers.",
        "",
        C.table(["batch", "engine samples/s", "engine peak GB", "bare samples/s", "bare peak GB", "engine / bare"], out),
    ])


def main() -> None:
    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
        p.add_argument("--result", default="", help=argparse.SUPPRESS)
        p.add_argument("--tmp", default="", help=argparse.SUPPRESS)
        p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: check the code path without a GPU")
        p.add_argument("--batch-sizes", default="8,64,512,2048", help="comma-separated per-step batch sizes")
        p.add_argument("--log-freq", type=int, default=10, help="loop steps per timing window (default 10)")
        p.add_argument("--windows", type=int, default=3, help="steady windows per run (default 3)")
        p.add_argument("--num-workers", type=int, default=4, help="DataLoader workers for both loops (default 4)")

    args = C.parse_args(__doc__.splitlines()[0], extra)
    args.repeats = args.repeats or (1 if args.smoke else 3)
    if args.smoke:
        args.batch_sizes, args.num_workers = "2", 0
    if args.worker:
        worker(args)
        return
    ctx = C.Context.now()
    argv = [f"--repeats={args.repeats}", f"--device={args.device}", f"--batch-sizes={args.batch_sizes}", f"--log-freq={args.log_freq}",
            f"--windows={args.windows}", f"--num-workers={args.num_workers}", *(["--smoke"] if args.smoke else [])]
    with tempfile.TemporaryDirectory(prefix="lr-bench-gpu-") as tmp:
        res = C.run_worker(1, SCRIPT, [*argv, f"--tmp={tmp}"], Path(tmp) / "r.json", timeout=1800)
    flags = [f"--device={args.device}"] if args.device != "cuda" else []
    C.write_section(args.out, "gpu_throughput", TITLE, C.command_line("gpu_throughput.py", args, flags), ctx, _section(res, args), args.smoke)


if __name__ == "__main__":
    main()
