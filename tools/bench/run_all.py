"""Run every benchmark in tools/bench, one after the other, into one BENCHMARKS file.

    uv run python tools/bench/run_all.py [--smoke] [--out=BENCHMARKS.md] [--only=name,name]

Each benchmark is its own subprocess (`tools/bench/<name>.py`) and writes its own section;
one that fails is reported at the end (exit 1) without stopping the others.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

HERE = Path(__file__).resolve().parent


def main() -> None:
    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument("--only", default="", help="comma-separated benchmark names (default: all, in BENCHMARKS.md order)")

    args = C.parse_args(__doc__.splitlines()[0], extra)
    names = args.only.split(",") if args.only else list(C.ORDER)
    unknown = [n for n in names if not (HERE / f"{n}.py").is_file()]
    if unknown:
        sys.exit(f"run_all: unknown benchmark(s) {unknown}; known: {', '.join(C.ORDER)}")
    failed = []
    for name in names:
        cmd = [sys.executable, str(HERE / f"{name}.py"), f"--out={args.out}"]
        cmd += ["--smoke"] if args.smoke else []
        cmd += [f"--repeats={args.repeats}"] if args.repeats else []
        print(f"=== {name}: {' '.join(cmd)}", flush=True)
        t0 = time.perf_counter()
        code = subprocess.call(cmd, env=C.bench_env())
        print(f"=== {name}: exit {code} after {time.perf_counter() - t0:.0f} s", flush=True)
        if code != 0:
            failed.append(name)
    if failed:
        sys.exit(f"run_all: failed: {', '.join(failed)}")
    print(f"all benchmarks written to {args.out}")


if __name__ == "__main__":
    main()
