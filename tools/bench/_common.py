"""Shared plumbing for the benchmarks in tools/bench (not a benchmark itself).

Every benchmark is one command (`uv run python tools/bench/<name>.py`) that measures the
compared things side by side in the same run (interleaved repeats, medians), then
replaces its own section of BENCHMARKS.md (between `<!-- bench:<name> -->` markers) with
the numbers, the command that reproduces them, the machine, the versions, the date and
the load average. `--smoke` runs at a tiny size (for tests/test_bench_smoke.py) and labels
the section as a smoke run; it writes to a temporary file unless `--out` is given.

Multi-process parts run as local ranks with torchrun's environment (see `launch`), on
gloo, with OMP_NUM_THREADS=1 per process; the worker half of a benchmark is the same
file, run with `--worker`.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "BENCHMARKS.md"
ORDER = ["engine_overhead", "memory_fsdp", "checkpoint_io", "async_save", "converter", "startup", "gpu_throughput", "data_loading",
         "verify_scaling", "eval_success", "vs_lerobot_train"]
TITLE = "# lr benchmarks"
INTRO = """\
Each section is written by one command in `tools/bench/` and replaced when that command
runs again (`uv run python tools/bench/run_all.py` runs them all). Every comparison is
measured side by side in the same run: the compared things are interleaved (over several
repeats, or step by step where that is possible) and the reported ratio is the median of
the paired ratios, so that the ratios survive a machine shared with other work. Absolute
numbers move with the load average noted in each section; the ratios are the result.
"""


# ---------------------------------------------------------------- command line


def parse_args(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None,
               argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The flags every benchmark takes (--smoke, --out, --repeats), plus its own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat: checks the script runs (not a measurement)")
    parser.add_argument("--out", type=Path, default=None, help=f"BENCHMARKS file to update (default {DEFAULT_OUT.name} at the repo root; a temp file with --smoke)")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default per benchmark; 1 with --smoke)")
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = Path(tempfile.gettempdir()) / "BENCHMARKS.smoke.md" if args.smoke else DEFAULT_OUT
    return args


def command_line(script: str, args: argparse.Namespace, flags: Sequence[str] = ()) -> str:
    """The command that reproduces a section (the --out and --smoke flags shown when used).
    `tools/bench/gpu_device.sh` runs the scripts with the GPU machine's own python3 and
    names itself in LR_BENCH_VIA: the section then shows that command."""
    via = os.environ.get("LR_BENCH_VIA")
    if via:
        return via
    parts = ["uv", "run", "python", f"tools/bench/{script}"]
    if args.smoke:
        parts.append("--smoke")
    parts += list(flags)
    return " ".join(shlex.quote(p) for p in parts)


# ---------------------------------------------------------------- statistics


def median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def spread(values: Sequence[float], fmt: str = "{:.3f}") -> str:
    """`median (min-max, n=K)` for a table cell."""
    vals = list(values)
    if len(vals) == 1:
        return fmt.format(vals[0])
    return f"{fmt.format(median(vals))} ({fmt.format(min(vals))}-{fmt.format(max(vals))}, n={len(vals)})"


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


# ---------------------------------------------------------------- machine and versions


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _ram_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


def _version(dist_name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist_name)
    except PackageNotFoundError:
        pass
    if dist_name.startswith("lr-"):
        # lr's packages run from their sources without being installed (tools/bench/gpu_device.sh)
        import tomllib

        pyproject = REPO / "packages" / dist_name / "pyproject.toml"
        if pyproject.exists():
            return str(tomllib.loads(pyproject.read_text())["project"]["version"]) + " (sources)"
    return "absent"


def _git_commit() -> str:
    """HEAD, `+dirty` when tracked code differs from it; LR_BENCH_COMMIT where the tree is a
    copy without git (the GPU machine of tools/bench/gpu_device.sh)."""
    given = os.environ.get("LR_BENCH_COMMIT")
    if given:
        return given
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        # BENCHMARKS.md is left out: an earlier section written in the same session does not change what is measured
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!BENCHMARKS.md"], cwd=REPO,
                               capture_output=True, text=True, timeout=10)
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine_line() -> str:
    return f"{os.cpu_count()} CPU cores ({_cpu_model()}), {_ram_gib():.0f} GiB RAM, {platform.system()} {platform.release()}"


def versions_line() -> str:
    return (
        f"torch {_version('torch')}, Python {platform.python_version()}, lr {_version('lr-engine')} "
        f"(git {_git_commit()}), accelerate {_version('accelerate')}, safetensors {_version('safetensors')}"
    )


def load_average() -> str:
    try:
        one, five, _ = os.getloadavg()
        return f"{one:.1f} (1 min) / {five:.1f} (5 min)"
    except OSError:
        return "unknown"


@dataclass
class Context:
    """What a section records about the run besides its numbers."""

    started: str
    load_start: str

    @staticmethod
    def now() -> Context:
        return Context(started=_dt.datetime.now().astimezone().isoformat(timespec="seconds"), load_start=load_average())


# ---------------------------------------------------------------- BENCHMARKS.md


def _marker(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"


def _sections(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for match in re.finditer(r"<!-- bench:(\w+) -->\n(.*?)<!-- /bench:\1 -->\n?", text, flags=re.S):
        found[match.group(1)] = match.group(2)
    return found


def _outside_sections(text: str) -> tuple[str, str]:
    """What a person wrote in the file outside the title, the intro and the sections: the part
    before the first section (an index of the results), and the rest (kept at the end)."""
    first = re.search(r"<!-- bench:\w+ -->", text)
    before, after = (text[: first.start()], text[first.start() :]) if first else ("", text)
    before = before.replace(TITLE, "", 1).replace(INTRO, "", 1).strip()
    after = re.sub(r"<!-- bench:(\w+) -->\n.*?<!-- /bench:\1 -->\n?", "", after, flags=re.S).strip()
    return before, after


def write_section(out: Path, name: str, title: str, command: str, ctx: Context, body: str, smoke: bool) -> None:
    """Replace (or add) section `name` of `out`; sections keep the order of ORDER."""
    header = [
        f"## {title}",
        "",
        *(["**SMOKE RUN (tiny sizes, one repeat): checks that the script runs; these are not measurements.**", ""] if smoke else []),
        f"- Command: `{command}`",
        f"- Date: {ctx.started}",
        f"- Machine: {machine_line()}",
        f"- Versions: {versions_line()}",
        f"- Load average: {ctx.load_start} at the start, {load_average()} at the end "
        "(the machine is shared with other engineers' test runs; the compared runs are interleaved for that reason)",
        "",
        "",
    ]
    content = "\n".join(header) + body.rstrip() + "\n\n"
    text = out.read_text() if out.exists() else ""
    existing = _sections(text)
    existing[name] = content
    names = [n for n in ORDER if n in existing] + [n for n in existing if n not in ORDER]
    before, after = _outside_sections(text)  # what a person wrote stays where it was
    parts = [TITLE, "", INTRO, *([before, ""] if before else [])]
    for n in names:
        begin, end = _marker(n)
        parts += [begin, existing[n].rstrip() + "\n", end, ""]
    if after:
        parts += [after, ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text("\n".join(parts))
    os.replace(tmp, out)
    print(f"wrote section {name!r} of {out}", flush=True)


def settle(seconds: float) -> None:
    """Commit the file system's pending work (the discards of the files deleted last, another
    process's unflushed writes), then wait for the disk to process it, so that the next write
    neither lands on blocks the host still backs from files just deleted nor shares the disk
    with an earlier writeback (checkpoint_io.py's docstring has the measurements)."""
    os.sync()
    time.sleep(seconds)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- processes


def bench_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of every benchmark subprocess: one intra-op thread, no accelerate config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "FSDP_", "PARALLELISM_CONFIG_"))}
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "LR_NO_PROGRESS": "1"})
    if extra:
        env.update(extra)
    return env


def compile_bytecode(python: Path | str = sys.executable) -> None:
    """Compile `python`'s installed packages and lr's sources to bytecode, as a first run does.

    A machine with PYTHONDONTWRITEBYTECODE=1 (the CI machines) never caches bytecode, so each
    process compiles torch again (`import torch` took 4-5 s instead of about 1.5 s). Users'
    machines cache it on the first run; the start-up benchmarks measure that state.
    `compileall` skips files whose bytecode is current.
    """
    code = ("import compileall, sys, sysconfig; "
            "[compileall.compile_dir(d, quiet=2, workers=2) for d in [sysconfig.get_paths()['purelib'], *sys.argv[1:]]]")
    sources = [str(p) for pattern in ("packages/*/src", "apps/*/src", "examples/*/src") for p in sorted(REPO.glob(pattern))]
    # compile_dir returns False when one file fails (packages ship test fixtures with syntax
    # errors); that file is then compiled at import, as without this step
    subprocess.run([str(python), "-c", code, *sources], check=False, cwd=REPO, timeout=1800)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(nproc: int, cmd: Sequence[str], *, timeout: float, logs: Path) -> None:
    """Start `cmd` as `nproc` local ranks (the environment torchrun gives: RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT) and wait for all of them. A rank that
    fails stops the others; the error carries the tail of its output. torchrun itself is
    not used: its own process would cost one more torch import per launch, and nothing
    measured here depends on it."""
    print(f"+ [{nproc} ranks] " + " ".join(shlex.quote(str(c)) for c in cmd), flush=True)
    logs.mkdir(parents=True, exist_ok=True)
    port = str(free_port())
    procs = []
    for rank in range(nproc):
        env = bench_env({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
                         "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
        out = open(logs / f"rank{rank}.log", "w")
        procs.append((subprocess.Popen(list(cmd), env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT), out))
    deadline = time.monotonic() + timeout
    failed: int | None = None
    try:
        while any(p.poll() is None for p, _ in procs):
            bad = [r for r, (p, _) in enumerate(procs) if p.returncode not in (None, 0)]
            if bad or time.monotonic() > deadline:
                failed = bad[0] if bad else -1
                break
            time.sleep(0.05)
        else:
            bad = [r for r, (p, _) in enumerate(procs) if p.returncode != 0]
            failed = bad[0] if bad else None
    finally:
        for p, out in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            out.close()
    if failed is not None:
        which = "timed out" if failed < 0 else f"rank {failed} exited with {procs[failed][0].returncode}"
        tail = (logs / f"rank{max(failed, 0)}.log").read_text()[-6000:]
        raise RuntimeError(f"{which}: {' '.join(map(str, cmd))}\n{tail}")


def run_checked(cmd: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None, cwd: Path | None = None,
                echo: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a subprocess; on failure raise with the tail of its output."""
    if echo:
        print("+ " + " ".join(shlex.quote(str(c)) for c in cmd), flush=True)
    proc = subprocess.run(list(cmd), env=dict(env) if env is not None else bench_env(), capture_output=True, text=True,
                          timeout=timeout, cwd=cwd or REPO)
    if proc.returncode != 0:
        tail = (proc.stdout[-3000:] + "\n" + proc.stderr[-6000:]).strip()
        raise RuntimeError(f"command failed with exit code {proc.returncode}: {' '.join(map(str, cmd))}\n{tail}")
    return proc


def run_worker(nproc: int, script: Path, argv: Sequence[str], result: Path, *, timeout: float) -> Any:
    """Run `script --worker argv` in one process or as `nproc` ranks; return its JSON result."""
    result.unlink(missing_ok=True)
    cmd = [sys.executable, str(script), "--worker", f"--result={result}", *argv]
    if nproc > 1:
        launch(nproc, cmd, timeout=timeout, logs=result.with_suffix(".logs"))
    else:
        run_checked(cmd, timeout=timeout)
    return json.loads(result.read_text())


def write_result(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def finish_worker(code: int = 0) -> None:
    """The gloo-safe end of a worker (docs/architecture.md, measured facts): barrier, destroy the group, flush, _exit."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def drop_file_cache(root: Path) -> None:
    """Evict `root`'s (already fsynced) pages from the page cache: POSIX_FADV_DONTNEED, no root needed."""
    paths = [root] if root.is_file() else [Path(d) / n for d, _, names in os.walk(root) for n in names]
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def tree_bytes(root: Path) -> int:
    return sum((Path(d) / n).stat().st_size for d, _, names in os.walk(root) for n in names)


def now() -> float:
    return time.perf_counter()
