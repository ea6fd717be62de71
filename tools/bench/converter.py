"""Converter: `lr-checkpoint convert` against `accelerate.utils.merge_fsdp_weights`.

    uv run python tools/bench/converter.py [--repeats=3] [--smoke]

Both merge the same DCP model shards (written by a 2-process FSDP2 `save_checkpoint` of
the 201 MB model of checkpoint_io.py, format `dcp`) into one `model.safetensors`, each in
a fresh subprocess that imports the tool, then times its call: `lr_checkpoint.cli.main(
["convert", ...])` (the entry point of the `lr-checkpoint` console script) and
`merge_fsdp_weights(<pytorch_model_fsdp_0>, <out>, safe_serialization=True)`. Reported:
the process's wall time (start to exit), the call's time, and the process's peak RSS
(its own `ru_maxrss`, from `os.wait4`). Import baselines run the same way: each tool's
imports alone, and `import torch, torch.distributed.checkpoint` (about 610 MB, docs/architecture.md).
The DCP files' pages are dropped from the page cache before every conversion. lr's
convert fsyncs its output before returning and accelerate's does not, so accelerate's
process also times an fsync of its output after the call (reported apart). Tools and
baselines alternate (order reversed on odd repeats). Each tool's conversion starts after
`os.sync()` and --settle seconds (default 12, 0 with --smoke), as checkpoint_io.py's writes
do: accelerate's process exits with its output still in the page cache, and its writeback
would otherwise share the disk with whatever runs next (lr's conversion, on odd repeats), and
the output deleted just before a tool's run would leave blocks that take writes faster until
their discard goes through. Targets: lr >= 2x faster; lr's peak RSS above its import
baseline <= 1.3 x the model size.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
from lr_config.layout import MODEL_WEIGHTS, StepFiles  # noqa: E402

SPEED_TARGET = 2.0
RSS_TARGET = 1.3
SCRIPT = Path(__file__).resolve()

BASELINES = {
    "torch + DCP import": "import torch, torch.distributed.checkpoint",
    "lr-checkpoint imports": "import lr_checkpoint.cli, lr_checkpoint._convert",
    "accelerate imports": "from accelerate.utils import merge_fsdp_weights; import torch.distributed.checkpoint.format_utils",
}


# ---------------------------------------------------------------- worker: write the DCP checkpoint


def worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    import _stack
    from lr_checkpoint import save_checkpoint

    dist.init_process_group("gloo")
    model, optimizer = _stack.build(_stack.SMOKE if args.smoke else _stack.FULL, distributed=True)
    step_dir = save_checkpoint(Path(args.tmp), 1, _stack.save_request(model, optimizer, 1, "dcp"))
    if dist.get_rank() == 0:
        C.write_result(Path(args.result), {"step_dir": str(step_dir), "model_bytes": _stack.model_bytes(model)})
    C.finish_worker(0)


# ---------------------------------------------------------------- parent


def measure(cmd: list[str]) -> dict[str, float]:
    """Wall seconds and peak RSS (MB) of one subprocess (its own rusage), and the `WORK`
    seconds it prints (the call alone, after its imports), if any."""
    t0 = C.now()
    proc = subprocess.Popen(cmd, env=C.bench_env(), cwd=C.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    output = proc.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    wall = C.now() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed ({proc.returncode}):\n{output[-4000:]}")
    timed = {f"{tag.lower()}_s": float(line.split()[1]) for line in output.splitlines() for tag in ("WORK", "SYNC") if line.startswith(tag + " ")}
    torch = [float(line.split()[1]) for line in output.splitlines() if line.startswith("TORCH ")]
    return {"wall_s": wall, "rss_mb": usage.ru_maxrss * 1024 / 1e6, **timed, **({"torch_imported": torch[0]} if torch else {})}


# Each tool runs in a fresh process that imports what it needs, then times its call.
LR_CODE = """\
import sys, time
import lr_checkpoint.cli, lr_checkpoint._convert
t = time.perf_counter()
code = lr_checkpoint.cli.main(["convert", {step_dir!r}])
print("WORK", time.perf_counter() - t)
print("TORCH", int("torch" in sys.modules))
sys.exit(code)
"""
ACCELERATE_CODE = """\
import os, time
from accelerate.utils import merge_fsdp_weights
import torch.distributed.checkpoint.format_utils
t = time.perf_counter()
merge_fsdp_weights({dcp_dir!r}, {out!r}, safe_serialization=True)
print("WORK", time.perf_counter() - t)
# lr's convert fsyncs what it wrote before it returns; accelerate's does not: time that too
t = time.perf_counter()
with open({out!r} + "/model.safetensors", "rb") as f:
    os.fsync(f.fileno())
print("SYNC", time.perf_counter() - t)
"""


def same_tensors(a: Path, b: Path) -> bool:
    from safetensors.numpy import load_file

    x, y = load_file(str(a)), load_file(str(b))
    return sorted(x) == sorted(y) and all(x[k].dtype == y[k].dtype and (x[k] == y[k]).all() for k in x)


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    made = C.run_worker(2, SCRIPT, [f"--tmp={tmp}/ckpts", *(["--smoke"] if args.smoke else [])], tmp / "r.json", timeout=900)
    step_dir = Path(made["step_dir"])
    dcp_dir = StepFiles(step_dir).model_dcp
    lr_out = StepFiles(step_dir).pretrained / MODEL_WEIGHTS
    acc_out = tmp / "merged"
    codes = {
        "lr-checkpoint convert": LR_CODE.format(step_dir=f"--checkpoint_dir={step_dir}"),
        "accelerate merge_fsdp_weights": ACCELERATE_CODE.format(dcp_dir=str(dcp_dir), out=str(acc_out)),
        **BASELINES,
    }
    outputs = {"lr-checkpoint convert": lr_out, "accelerate merge_fsdp_weights": acc_out}
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in codes}
    for repeat in range(args.repeats):
        for name in list(codes) if repeat % 2 == 0 else list(reversed(codes)):
            if name in outputs:
                shutil.rmtree(outputs[name]) if outputs[name].is_dir() else outputs[name].unlink(missing_ok=True)
            C.drop_file_cache(dcp_dir)
            if name in outputs:
                C.settle(args.settle)
            samples[name].append(measure([sys.executable, "-c", codes[name]]))
    equal = same_tensors(lr_out, acc_out / MODEL_WEIGHTS)
    return {"model_bytes": made["model_bytes"], "samples": samples, "equal": equal}


def _section(res: dict[str, Any], repeats: int, settle: float) -> str:
    s = res["samples"]
    model_mb = res["model_bytes"] / 1e6
    med = {name: {k: C.median(x[k] for x in runs) for k in runs[0]} for name, runs in s.items()}
    lr, acc = "lr-checkpoint convert", "accelerate merge_fsdp_weights"
    own_base = {lr: "lr-checkpoint imports", acc: "accelerate imports"}
    torch_base = "torch + DCP import"
    rows = []
    lr_torch = any(x.get("torch_imported", 1) for x in s[lr])
    for name in (lr, acc):
        above = med[name]["rss_mb"] - med[own_base[name]]["rss_mb"]
        above_torch = f"{med[name]['rss_mb'] - med[torch_base]['rss_mb']:.0f}" if name == acc or lr_torch else "- (never imports torch)"
        rows.append([f"`{name}`", C.spread([x["wall_s"] for x in s[name]], "{:.2f}"), C.spread([x["work_s"] for x in s[name]], "{:.2f}"),
                     C.spread([x["rss_mb"] for x in s[name]], "{:.0f}"), f"{above:.0f} ({above / model_mb:.2f} x model)", above_torch])
    for name, code in BASELINES.items():
        rows.append([f"baseline: `{code}`", C.spread([x["wall_s"] for x in s[name]], "{:.2f}"), "-",
                     C.spread([x["rss_mb"] for x in s[name]], "{:.0f}"), "-", "-"])
    speed_total = [a["wall_s"] / b["wall_s"] for a, b in zip(s[acc], s[lr])]
    speed_work = [a["work_s"] / b["work_s"] for a, b in zip(s[acc], s[lr])]
    speed_durable = [(a["work_s"] + a["sync_s"]) / b["work_s"] for a, b in zip(s[acc], s[lr])]
    rss_above = (med[lr]["rss_mb"] - med[own_base[lr]]["rss_mb"]) / model_mb
    rss_whole = {name: med[name]["rss_mb"] / model_mb for name in (lr, acc)}
    body = [
        f"DCP model shards of a {model_mb:.1f} MB fp32 model (written by 2 FSDP2 ranks), {repeats} interleaved repeats; "
        f"each tool's conversion starts {settle:g} s after `os.sync()` (no other process's writeback still running, "
        "no blocks freed a moment ago). "
        "Each tool runs in a fresh `python -c` process that imports it, then times its call: `lr_checkpoint.cli.main"
        "([\"convert\", ...])` (the `lr-checkpoint` console script's entry point) or `merge_fsdp_weights(...)`. Process = "
        "start to exit (imports included); call = the conversion alone. RSS = the process's own peak (`ru_maxrss` from "
        "`os.wait4`), MB = 10^6 bytes; \"above own imports\" subtracts the median peak of a process that only imports the "
        "same modules.",
        "",
        C.table(["process", "process s", "call s", "peak RSS MB", "RSS above own imports MB", "RSS above torch+DCP import MB"], rows),
        "",
        C.table(["target", "measured (accelerate / lr, per repeat)", ""], [
            [f"lr >= {SPEED_TARGET}x faster: the conversion call", f"{C.spread(speed_work, '{:.2f}')}x",
             C.verdict(C.median(speed_work) >= SPEED_TARGET)],
            [f"lr >= {SPEED_TARGET}x faster: the call, accelerate's plus an fsync of its output (lr's call fsyncs)",
             f"{C.spread(speed_durable, '{:.2f}')}x", C.verdict(C.median(speed_durable) >= SPEED_TARGET)],
            [f"lr >= {SPEED_TARGET}x faster: the whole process (imports included)", f"{C.spread(speed_total, '{:.2f}')}x",
             C.verdict(C.median(speed_total) >= SPEED_TARGET)],
            [f"lr peak RSS above its import baseline <= {RSS_TARGET} x model", f"{rss_above:.2f} x model",
             C.verdict(rss_above <= RSS_TARGET)],
            [f"lr peak RSS of the whole process <= {RSS_TARGET} x model", f"{rss_whole[lr]:.2f} x model (accelerate: {rss_whole[acc]:.2f})",
             C.verdict(rss_whole[lr] <= RSS_TARGET)],
        ]),
        "",
        f"Both outputs hold the same tensors, bit for bit: {res['equal']}. `lr-checkpoint convert` fsyncs its file "
        "before it returns; `merge_fsdp_weights` returns with its file possibly still in the page cache; the fsync "
        f"of accelerate's output, timed right after its call, took {C.spread([x['sync_s'] for x in s[acc]], '{:.2f}')} s. "
        "Peak RSS above a baseline can undercount what a process held, since memory freed after the imports is reused. "
        f"torch in `sys.modules` after lr's conversion: {'yes' if lr_torch else 'no'}.",
    ]
    return "\n".join(body)


def main() -> None:
    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
        p.add_argument("--result", default="", help=argparse.SUPPRESS)
        p.add_argument("--tmp", default="", help=argparse.SUPPRESS)
        p.add_argument("--settle", type=float, default=None,
                       help="seconds between os.sync() and each tool's conversion (default 12, 0 with --smoke)")

    args = C.parse_args(__doc__.splitlines()[0], extra)
    args.repeats = args.repeats or (1 if args.smoke else 3)
    if args.settle is None:
        args.settle = 0.0 if args.smoke else 12.0
    if args.worker:
        worker(args)
        return
    ctx = C.Context.now()
    with tempfile.TemporaryDirectory(prefix="lr-bench-convert-") as tmp:
        res = run(args, Path(tmp))
    flags = [] if args.smoke else [f"--repeats={args.repeats}"] + ([f"--settle={args.settle:g}"] if args.settle != 12 else [])
    C.write_section(args.out, "converter", "5. Converter: `lr-checkpoint convert` vs accelerate `merge_fsdp_weights`",
                    C.command_line("converter.py", args, flags), ctx, _section(res, args.repeats, args.settle), args.smoke)


if __name__ == "__main__":
    main()
