"""Start-up: `import lr_config`, lr-tui's first frame, and the first training step.

    uv run python tools/bench/startup.py [--repeats=3] [--smoke]

Every measurement is a fresh subprocess (OMP_NUM_THREADS=1), repeated and interleaved:
- `import lr_config`: the import's own time inside the process (perf_counter around it),
  and the whole process against `python -c pass`. Target < 0.15 s.
- lr-tui: the real `LrApp` (Launch view first, as `lr-tui` opens; the dry-run planner
  off so no torch subprocess starts) run headless at 120x40; the clock runs from the
  parent's `Popen` to the app's `Ready` event (Textual posts it once the DOM is mounted
  and the first frame is drawn), so it covers interpreter start and imports. Target < 1 s.
- `lr-engine train` (default ACT on the demo dataset, single process): from `Popen` to
  the first step's metrics line, fresh against resumed from a checkpoint of the same
  run (`--resume=true --config_path=<run>/checkpoints/last`).

The environment's bytecode is compiled first (`_common.compile_bytecode`): a user's machine
caches it on the first run, a machine with PYTHONDONTWRITEBYTECODE=1 never does.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

IMPORT_TARGET = 0.15
TUI_TARGET = 1.0

IMPORT_CODE = (
    "import sys, time; t, c = time.perf_counter(), time.process_time(); import lr_config; "
    "print(time.perf_counter() - t, time.process_time() - c, 'torch' in sys.modules)"
)
TUI_CODE = """\
import os, time
t0 = time.perf_counter()
from lr_tui._app import LrApp
t1 = time.perf_counter()

class FirstFrame(LrApp):
    def on_ready(self) -> None:
        os.write(1, f"READY {t1 - t0} {time.perf_counter() - t1} {time.process_time()}\\n".encode())
        self.exit()

FirstFrame(plan_runner=None).run(headless=True, size=(120, 40))
"""


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a running process, from /proc (clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def until_line(cmd: list[str], marker: str, timeout: float = 600) -> tuple[float, float, str]:
    """(seconds from Popen to the first stdout line starting with `marker`, the process's CPU
    seconds at that moment, the line); the process is then waited for."""
    t0 = C.now()
    proc = subprocess.Popen(cmd, env=C.bench_env(), cwd=C.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen: list[str] = []
    found: tuple[float, float, str] | None = None
    for line in proc.stdout:
        seen.append(line)
        if found is None and line.startswith(marker):
            found = (C.now() - t0, _cpu_seconds(proc.pid), line)
    code = proc.wait(timeout=timeout)
    if found is None or code != 0:
        raise RuntimeError(f"{cmd}: exit {code}, no line starting with {marker!r}:\n{''.join(seen)[-4000:]}")
    return found


def wall(cmd: list[str]) -> tuple[float, str]:
    t0 = C.now()
    out = C.run_checked(cmd, timeout=300, echo=False).stdout
    return C.now() - t0, out


def engine_cmd(*flags: str) -> list[str]:
    return [sys.executable, "-m", "lr_engine.cli", "train", *flags]


def measure(args: argparse.Namespace, tmp: Path) -> dict[str, list[Any]]:
    small = ["--log_freq=1", "--batch_size=8"] + (["--policy.dim_model=32", "--policy.dim_feedforward=64"] if args.smoke else [])
    base = tmp / "base"
    C.compile_bytecode()
    C.run_checked(engine_cmd(*small, "--steps=2", "--save_freq=2", f"--output_dir={base}"), timeout=900)
    resume = [*small, "--resume=true", f"--config_path={base}/checkpoints/last", "--steps=3", "--save_checkpoint=false"]
    jobs = {
        "python -c pass": lambda r: wall([sys.executable, "-c", "pass"])[0],
        "import lr_config": lambda r: wall([sys.executable, "-c", IMPORT_CODE]),
        "lr-tui": lambda r: until_line([sys.executable, "-c", TUI_CODE], "READY"),
        "train fresh": lambda r: until_line(engine_cmd(*small, "--steps=1", "--save_checkpoint=false", f"--output_dir={tmp}/fresh{r}"), "step 1/")[:2],
        "train resumed": lambda r: until_line(engine_cmd(*resume), "step 3/")[:2],
    }
    samples: dict[str, list[Any]] = {name: [] for name in jobs}
    for repeat in range(args.repeats):
        for name in list(jobs) if repeat % 2 == 0 else list(reversed(jobs)):
            print(f"repeat {repeat}: {name}", flush=True)
            samples[name].append(jobs[name](repeat))
    return samples


def _section(s: dict[str, list[Any]], repeats: int) -> str:
    imp = [out.split() for _, out in s["import lr_config"]]
    imp_wall, imp_cpu = [float(x[0]) for x in imp], [float(x[1]) for x in imp]
    torch_loaded = any(x[2] == "True" for x in imp)
    proc_wall = [w for w, _ in s["import lr_config"]]
    tui = [t for t, _, _ in s["lr-tui"]]
    tui_parts = [line.split() for _, _, line in s["lr-tui"]]
    tui_import, tui_frame, tui_cpu = ([float(p[i]) for p in tui_parts] for i in (1, 2, 3))
    fresh, resumed = s["train fresh"], s["train resumed"]
    rows = [
        ["`import lr_config`, inside the process", C.spread(imp_wall), C.spread(imp_cpu), f"< {IMPORT_TARGET}", C.verdict(C.median(imp_wall) < IMPORT_TARGET)],
        ["`python -c 'import lr_config'` process (`python -c pass`: " + C.spread(s["python -c pass"]) + ")", C.spread(proc_wall), "-", "-", ""],
        ["lr-tui: Popen to first frame (`Ready`)", C.spread(tui), C.spread(tui_cpu), f"< {TUI_TARGET}", C.verdict(C.median(tui) < TUI_TARGET)],
        ["lr-tui: of which `from lr_tui._app import LrApp`", C.spread(tui_import), "-", "-", ""],
        ["lr-tui: of which import end to first frame", C.spread(tui_frame), "-", "-", ""],
        ["`lr-engine train`: Popen to first step logged, fresh", C.spread([w for w, _ in fresh]), C.spread([c for _, c in fresh]), "-", ""],
        ["`lr-engine train`: Popen to first step logged, resumed", C.spread([w for w, _ in resumed]), C.spread([c for _, c in resumed]), "-", ""],
        ["resumed - fresh (paired per repeat)", C.spread([r[0] - f[0] for f, r in zip(fresh, resumed)]),
         C.spread([r[1] - f[1] for f, r in zip(fresh, resumed)]), "-", ""],
    ]
    body = [
        f"Seconds; `median (min-max, n)` over {repeats} interleaved repeats (order reversed on odd repeats). Wall is what "
        "the targets judge; CPU is the process's own CPU time up to the same point (user + system), which a loaded machine "
        f"inflates far less than wall. `import lr_config` loads torch: {torch_loaded}. Training runs: default ACT policy "
        "(1,073,986 parameters), batch 8, single process, CPU, the demo dataset already generated; the resumed run loads "
        "the `safetensors` checkpoint of a run of the same settings (step 2) and logs step 3. The environment's bytecode is compiled before the first repeat, as a user's first run leaves it.",
        "",
        C.table(["what", "wall s", "CPU s", "target (wall)", ""], rows),
    ]
    return "\n".join(body)


def main() -> None:
    args = C.parse_args(__doc__.splitlines()[0])
    args.repeats = args.repeats or (1 if args.smoke else 3)
    ctx = C.Context.now()
    with tempfile.TemporaryDirectory(prefix="lr-bench-startup-") as tmp:
        samples = measure(args, Path(tmp))
    flags = [] if args.smoke else [f"--repeats={args.repeats}"]
    C.write_section(args.out, "startup", "6. Start-up times", C.command_line("startup.py", args, flags), ctx, _section(samples, args.repeats), args.smoke)


if __name__ == "__main__":
    main()
