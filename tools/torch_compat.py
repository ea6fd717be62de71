"""Run the checkpoint tests against the lowest torch lr declares and against the locked one.

    uv run python tools/torch_compat.py [--versions=2.9.0,locked] [--tests=PATH ...]

Each version runs in the project's environment with torch swapped by uv
(`uv run --with torch==X`: an overlay environment; the lock and `.venv` stay as they are).
`locked` is the version in uv.lock. The tests are lr-checkpoint's own (saves, loads and
reshards of every format in real processes, DCP `.metadata` read by the restricted unpickler,
the torch.save archive reader, resume and convert with the fast paths on and off, convert,
verify) and `tests/test_security.py` (what the restricted unpickler refuses): what lr's
readers of torch's private formats meet when another torch wrote the files.

Prints one Markdown row per version (torch, passed, failed, seconds), ready for the README's
compatibility table, and exits 1 when any version failed. It downloads the torch wheels it
lacks (a package registry is needed), so CI does not run it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOWEST = "2.9.0"
TESTS = ["packages/lr-checkpoint/tests", "tests/test_security.py"]


def locked_torch() -> str:
    text = (ROOT / "uv.lock").read_text()
    found = re.search(r'\[\[package\]\]\nname = "torch"\nversion = "([^"]+)"', text)
    if found is None:
        raise SystemExit("uv.lock: no torch package")
    return found.group(1)


def uv_run(version: str | None) -> list[str]:
    return ["uv", "run", *(["--with", f"torch=={version}"] if version else []), "python"]


def run_version(version: str, tests: list[str]) -> tuple[str, int, int, float, str]:
    pinned = None if version == "locked" else version
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    probe = subprocess.run([*uv_run(pinned), "-c", "import torch; print(torch.__version__)"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=3600)
    if probe.returncode != 0:
        return version, 0, 1, 0.0, probe.stderr[-2000:]
    actual = probe.stdout.strip().splitlines()[-1]
    start = time.monotonic()
    result = subprocess.run([*uv_run(pinned), "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=7200)
    seconds = time.monotonic() - start
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    passed = int(m.group(1)) if (m := re.search(r"(\d+) passed", summary)) else 0
    failed = sum(int(n) for n in re.findall(r"(\d+) (?:failed|error)", summary))
    if result.returncode != 0 and failed == 0:
        failed = 1
    return actual, passed, failed, seconds, result.stdout[-4000:] if result.returncode else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", default=f"{LOWEST},locked", help="comma-separated torch versions; `locked` = uv.lock's")
    parser.add_argument("--tests", nargs="*", default=TESTS, help="test paths, relative to the repo")
    args = parser.parse_args(argv)
    rows, failed_any = [], False
    for version in args.versions.split(","):
        print(f"torch_compat: torch {version} ({locked_torch() if version == 'locked' else 'overlay'}) ...", flush=True)
        actual, passed, failed, seconds, tail = run_version(version, args.tests)
        if tail:
            print(tail, flush=True)
        failed_any |= failed > 0
        rows.append(f"| {actual} | {passed} | {failed} | {seconds:.0f} |")
    print("\n| torch | passed | failed | seconds |\n|---|---|---|---|\n" + "\n".join(rows))
    print(f"\ncommand: uv run python tools/torch_compat.py --versions={args.versions}")
    return 1 if failed_any else 0


if __name__ == "__main__":
    sys.exit(main())
