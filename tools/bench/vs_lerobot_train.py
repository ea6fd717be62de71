"""lr against `lerobot-train`: LeRobot's ACT with its defaults, on a LeRobot-written video dataset (CPU).

    uv run python tools/bench/vs_lerobot_train.py [--repeats=2] [--steps=25] [--smoke]

The same model (`--policy.type=act`: LeRobot's defaults, ResNet-18 from scratch,
`pretrained_backbone_weights=null`), the same dataset (`packages/lr-engine/tests/data/
lerobot_reference/dataset_pointmass_video`, written by LeRobot 0.6.1 itself: one 48x64 AV1
camera, a 4-value state, a 2-value environment state; decoded with PyAV on both sides), batch 8
per process, no DataLoader workers, no checkpoints, one intra-op thread per process
(OMP_NUM_THREADS=1), in two layouts:

- single process: `lr-engine train` against `lerobot-train`;
- 2 processes, DDP on gloo: `torchrun --nproc-per-node=2 -m lr_engine.cli train
  --parallelism.dp_replicate=2` against `accelerate launch --multi_gpu --num_processes=2 -m
  lerobot.scripts.lerobot_train` (LeRobot's launcher for several processes; on CPU it runs
  torchrun underneath).

Both log every step (`--log_freq=1`) and the parent timestamps each step's log line as it
arrives. Start-up: from `Popen` to the first step's line. Throughput: global samples per second
between the end of the warm-up (`WARMUP` steps) and the last step, from those timestamps (the
same clock for both tools, whatever each reports about itself). The sides alternate within each
repeat (order reversed on odd repeats); ratios are per repeat, then the median.

LeRobot runs in its own environment (Python 3.12 and its torch, built once under the bench
cache with uv; see data_loading.py's `lerobot_python`). Both environments' bytecode is compiled
before the first run (`_common.compile_bytecode`), as a user's first run leaves it. `--smoke` runs
lr alone at a tiny size.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

DATASET = C.REPO / "packages" / "lr-engine" / "tests" / "data" / "lerobot_reference" / "dataset_pointmass_video"
BATCH = 8
WARMUP = 5
TARGET_SPEEDUP = 1.2
LAYOUTS = {"single": 1, "DDP-2": 2}
SMOKE_POLICY = ["--policy.dim_model=32", "--policy.n_heads=2", "--policy.dim_feedforward=64", "--policy.chunk_size=10",
                "--policy.n_action_steps=10", "--policy.n_encoder_layers=1", "--policy.n_vae_encoder_layers=1"]
_LR_STEP = re.compile(r"^step (\d+)/\d+ ")
_LEROBOT_STEP = re.compile(r"\bstep:(\d+) ")


def lr_command(nproc: int, steps: int, out: Path, smoke: bool) -> list[str]:
    flags = ["--policy.type=act", "--policy.pretrained_backbone_weights=null", "--dataset.repo_id=local/pointmass",
             f"--dataset.root={DATASET}", f"--batch_size={BATCH}", f"--steps={steps}", "--log_freq=1", "--save_checkpoint=false",
             "--num_workers=0", f"--output_dir={out}", *(SMOKE_POLICY if smoke else [])]
    if nproc == 1:
        return [sys.executable, "-m", "lr_engine.cli", "train", *flags]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "lr_engine.cli", "train",
            *flags, f"--parallelism.dp_replicate={nproc}"]


def lerobot_command(python: Path, nproc: int, steps: int, out: Path) -> list[str]:
    flags = ["--dataset.repo_id=local/pointmass", f"--dataset.root={DATASET}", "--dataset.video_backend=pyav", "--policy.type=act",
             "--policy.pretrained_backbone_weights=null", "--policy.device=cpu", "--policy.push_to_hub=false", f"--batch_size={BATCH}",
             f"--steps={steps}", "--log_freq=1", "--save_checkpoint=false", "--wandb.enable=false", "--num_workers=0", f"--output_dir={out}"]
    if nproc == 1:
        return [str(python), "-m", "lerobot.scripts.lerobot_train", *flags]
    accelerate = python.parent / "accelerate"
    return [str(accelerate), "launch", "--multi_gpu", f"--num_processes={nproc}", "--num_machines=1", "--mixed_precision=no",
            "--dynamo_backend=no", "-m", "lerobot.scripts.lerobot_train", *flags]


def timed_run(cmd: list[str], pattern: re.Pattern[str], *, timeout: float, env: dict[str, str]) -> dict[str, Any]:
    """Run `cmd`; the monotonic time (from Popen) at which each step's line arrived."""
    print("+ " + " ".join(cmd), flush=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=C.REPO, bufsize=1)
    steps: dict[int, float] = {}
    tail: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.monotonic() - t0
            tail.append(line)
            del tail[:-60]
            match = pattern.search(line)
            if match:
                steps.setdefault(int(match.group(1)), now)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise RuntimeError(f"timed out: {' '.join(cmd)}\n{''.join(tail)}") from None
    reader.join(timeout=10)
    if code != 0 or not steps:
        raise RuntimeError(f"exit {code}, {len(steps)} steps logged: {' '.join(cmd)}\n{''.join(tail)}")
    return {"steps": steps, "wall": time.monotonic() - t0}


def summarize(run: dict[str, Any], nproc: int) -> tuple[float, float]:
    """(seconds from Popen to the first step's line, global samples/s after the warm-up)."""
    steps: dict[int, float] = run["steps"]
    first, last = min(steps), max(steps)
    start = min((s for s in steps if s >= first + WARMUP), default=first)
    rate = BATCH * nproc * (last - start) / (steps[last] - steps[start]) if last > start else float("nan")
    return steps[first], rate


def measure(args: Any, tmp: Path) -> dict[tuple[str, str], list[tuple[float, float]]]:
    python = None
    if not args.smoke:
        from data_loading import lerobot_python

        python = lerobot_python()
        C.compile_bytecode(python)
    C.compile_bytecode()
    sides = ["lr"] + (["lerobot"] if python is not None else [])
    layouts = {"single": 1} if args.smoke else LAYOUTS
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {(s, l): [] for s in sides for l in layouts}
    env = C.bench_env({"HF_HUB_OFFLINE": "1", "HF_LEROBOT_HOME": str(tmp / "lerobot_home"), "LR_CACHE_DIR": str(tmp / "lr_cache")})
    for repeat in range(args.repeats):
        for layout, nproc in layouts.items():
            for side in (sides if repeat % 2 == 0 else list(reversed(sides))):
                out = tmp / f"{side}-{layout}-{repeat}"
                if side == "lr":
                    run = timed_run(lr_command(nproc, args.steps, out, args.smoke), _LR_STEP, timeout=1800, env=env)
                else:
                    assert python is not None
                    run = timed_run(lerobot_command(python, nproc, args.steps, out), _LEROBOT_STEP, timeout=1800,
                                    env={**env, "PATH": f"{python.parent}{os.pathsep}{env.get('PATH', '')}"})
                samples[(side, layout)].append(summarize(run, nproc))
                print(f"repeat {repeat} {layout} {side}: first step at {samples[(side, layout)][-1][0]:.1f} s, "
                      f"{samples[(side, layout)][-1][1]:.2f} samples/s", flush=True)
    return samples


def section(samples: dict[tuple[str, str], list[tuple[float, float]]], args: Any) -> str:
    layouts = sorted({l for _, l in samples}, key=list(LAYOUTS).index)
    rows = []
    verdicts = []
    for layout in layouts:
        lr = samples[("lr", layout)]
        le = samples.get(("lerobot", layout))
        row = [layout, C.spread([r for _, r in lr], "{:.2f}"), C.spread([s for s, _ in lr], "{:.1f}")]
        if le:
            speed = [a[1] / b[1] for a, b in zip(lr, le)]
            start = [a[0] / b[0] for a, b in zip(lr, le)]
            ok = C.median(speed) >= TARGET_SPEEDUP and C.median(start) <= 1.0
            verdicts.append(ok)
            row += [C.spread([r for _, r in le], "{:.2f}"), C.spread([s for s, _ in le], "{:.1f}"), C.spread(speed, "{:.2f}"),
                    C.spread(start, "{:.2f}"), C.verdict(ok)]
        else:
            row += ["not run (--smoke)", "-", "-", "-", ""]
        rows.append(row)
    body = [
        f"ACT with LeRobot's defaults ({'a tiny ACT, --smoke' if args.smoke else '51.6M parameters, ResNet-18 from scratch, chunk 100'}), "
        f"LeRobot's own video dataset (`dataset_pointmass_video`: 4 episodes x 30 frames, one 48x64 AV1 camera), batch {BATCH} per "
        f"process, {args.steps} steps logged every step, OMP_NUM_THREADS=1, no DataLoader workers, no checkpoints; CPU, gloo. "
        f"Samples/s are global, from the parent's timestamps of each step's log line after {WARMUP} warm-up steps; start-up is "
        "`Popen` to the first step's line. `median (min-max, n)` over the interleaved repeats; the ratios are paired per repeat. "
        f"Target: lr at least {TARGET_SPEEDUP}x lerobot-train's samples/s in each layout, and no slower to start (ratio <= 1).",
        "",
        C.table(["layout", "lr samples/s", "lr start s", "lerobot-train samples/s", "lerobot-train start s", "samples/s ratio lr/LeRobot",
                 "start ratio lr/LeRobot", "target"], rows),
    ]
    return "\n".join(body)


def main() -> None:
    def extra(p: Any) -> None:
        p.add_argument("--steps", type=int, default=None, help="steps per run (default 25; 8 with --smoke)")

    args = C.parse_args(__doc__.splitlines()[0], extra)
    args.repeats = args.repeats or (1 if args.smoke else 2)
    args.steps = args.steps or (8 if args.smoke else 25)
    ctx = C.Context.now()
    with tempfile.TemporaryDirectory(prefix="lr-bench-vs-lerobot-") as tmp:
        samples = measure(args, Path(tmp))
    flags = [] if args.smoke else [f"--repeats={args.repeats}", f"--steps={args.steps}"]
    C.write_section(args.out, "vs_lerobot_train", "11. lr against lerobot-train (ACT, LeRobot's defaults, CPU)",
                    C.command_line("vs_lerobot_train.py", args, flags), ctx, section(samples, args), args.smoke)


if __name__ == "__main__":
    main()
