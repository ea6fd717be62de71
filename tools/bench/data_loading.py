"""Data loading: lr's LeRobotDataset against LeRobot 0.6.1's, on a video dataset with 2 cameras.

    uv run python tools/bench/data_loading.py [--repeats=5] [--episodes=25] [--smoke]

The dataset is lr's demo written as a LeRobot v3 video dataset (`make_demo_dataset(...,
video=True, cameras=("top", "wrist"), image_height=96, image_width=128)`: AV1 as LeRobot's
writer encodes it, g=2, crf=30), generated once per size into the bench cache
(`$LR_BENCH_CACHE`, else `~/.cache/lr-bench`) and read by both loaders from the same folder.

- Throughput: samples/s of a DataLoader over the dataset, lr's `LeRobotDataset(root,
  action_horizon=100)` against LeRobot 0.6.1's `LeRobotDataset(repo_id, root=root,
  delta_timestamps={"action": [i / fps for i in range(100)]}, video_backend="pyav")` (and
  both with a window of 10, lr's ACT default; `--horizons`): the
  same folder, the same shuffled batches (one numpy permutation, given to both as the
  DataLoader's batch_sampler), batch 8, the same num_workers (0 and 2), OMP_NUM_THREADS=1,
  each run a fresh process; after 5 warm-up batches, the time of the next `--batches`.
  The two alternate over `--repeats` repeats; the ratio is the median of the paired ratios.
  Target: lr >= 1.5x LeRobot's samples/s. LeRobot runs in its own environment (Python 3.12,
  its own torch), which this command builds once with uv (see `lerobot_python`).
- Training stall: `lr-engine train` of ACT (chunk 100) with the 2 cameras at batch 8 on the
  same dataset, num_workers 0 and 2; the share of step time spent waiting for data is
  `dataloading_s / (update_s + dataloading_s)` of the engine's own metrics.jsonl windows
  (the first window, warm-up, left out).
- Memory: peak RSS (VmHWM) of the loading process and of each DataLoader worker, the peak of
  the processes' summed PSS and anonymous RSS (sampled every 50 ms), for datasets of 1x, 4x
  and 16x `--episodes` episodes (one generator and seed: the smaller datasets' episodes are
  the first ones of the larger),
  num_workers 2, the same number of random batches; LeRobot's at the same sizes for context.
  Flat means: the 16x dataset's peak within 10% of the 1x dataset's, per process.

Every run's raw results (all repeats) are also written to `$TMPDIR/lr-bench-data_loading.json`.
`--smoke` runs tiny sizes in a temp folder and skips the LeRobot side (no environment build,
no network): it checks that the script, its runner and its section work.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402
from lr_config.layout import METRICS  # noqa: E402

TARGET = 1.5
LEROBOT_VERSION = "0.6.1"
LEROBOT_SPEC = f"lerobot[dataset,training]=={LEROBOT_VERSION}"
CAMERAS = ("top", "wrist")
HEIGHT, WIDTH = 96, 128
BATCH = 8
HORIZON = 100  # LeRobot's ACT chunk_size
WARMUP_BATCHES = 5
SIZES = (1, 4, 16)
FLAT = 0.10
REPO_ID = "lr-bench/video-demo"

# ---------------------------------------------------------------- the runner (both environments)

# One loading run, for lr (this environment) or LeRobot (its own); written to a temp file and run
# with each environment's python. Python >= 3.11, numpy and torch only at the top level.
RUNNER = r'''
import json, os, sys, threading, time

spec = json.loads(sys.argv[1])
t_start = time.perf_counter()
import numpy as np
import torch


def proc_status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmHWM", "VmRSS", "RssAnon"):
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def proc_pss(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


root, horizon, side = spec["root"], spec["horizon"], spec["side"]
if side == "lr":
    from lr_engine import LeRobotDataset

    t_import = time.perf_counter()
    ds = LeRobotDataset(root, action_horizon=horizon, video_backend="pyav")
else:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    t_import = time.perf_counter()
    with open(os.path.join(root, "meta", "info.json")) as f:
        fps = json.load(f)["fps"]
    ds = LeRobotDataset(spec["repo_id"], root=root, delta_timestamps={"action": [i / fps for i in range(horizon)]},
                        video_backend="pyav")
t_built = time.perf_counter()

n = len(ds)
need = (spec["warmup"] + spec["batches"]) * spec["batch_size"]
rng = np.random.default_rng(spec["seed"])
order = np.concatenate([rng.permutation(n) for _ in range(-(-need // n))])[:need]
batches = order.reshape(-1, spec["batch_size"]).tolist()

if spec.get("check"):
    keys = ["observation.images.top", "observation.images.wrist", "observation.state", "action", "action_is_pad"]
    items = [ds[int(i)] for i in spec["check"]]
    np.savez(spec["check_out"], **{k: np.stack([item[k].numpy() for item in items]) for k in keys})

loader = torch.utils.data.DataLoader(ds, batch_sampler=batches, num_workers=spec["num_workers"])
it = iter(loader)
pids = [os.getpid()] + [w.pid for w in getattr(it, "_workers", [])]
peak = {"anon": {p: 0 for p in pids}, "pss_sum": 0, "anon_sum": 0}
stop = threading.Event()


def take():
    anon = {p: proc_status(p).get("RssAnon", 0) for p in pids}
    for p, v in anon.items():
        peak["anon"][p] = max(peak["anon"][p], v)
    peak["anon_sum"] = max(peak["anon_sum"], sum(anon.values()))
    peak["pss_sum"] = max(peak["pss_sum"], sum(proc_pss(p) for p in pids))


def sample():
    while not stop.is_set():
        take()
        stop.wait(spec["sample_s"])


sampler = threading.Thread(target=sample, daemon=True) if spec["sample_s"] else None
if sampler is not None:
    sampler.start()
for _ in range(spec["warmup"]):
    next(it)
t0 = time.perf_counter()
samples = 0
for _ in range(spec["batches"]):
    samples += len(next(it)["action"])
elapsed = time.perf_counter() - t0
hwm = {p: proc_status(p).get("VmHWM", 0) for p in pids}
stop.set()
if sampler is not None:
    sampler.join()
    take()  # the last moment too: a short run may fall between two samples
del it

import av
try:
    from importlib.metadata import version
    lerobot_version = version("lerobot") if side == "lerobot" else None
except Exception:
    lerobot_version = None
print("RESULT " + json.dumps({
    "side": side, "frames": n, "samples": samples, "elapsed_s": elapsed, "samples_per_s": samples / elapsed,
    "import_s": t_import - t_start, "build_s": t_built - t_import,
    "main_hwm": hwm[pids[0]], "worker_hwm": [hwm[p] for p in pids[1:]],
    "main_anon": peak["anon"][pids[0]], "worker_anon": [peak["anon"][p] for p in pids[1:]],
    "pss_sum": peak["pss_sum"], "anon_sum": peak["anon_sum"],
    "versions": {"python": sys.version.split()[0], "torch": torch.__version__, "av": av.__version__, "lerobot": lerobot_version},
}), flush=True)
'''


# ---------------------------------------------------------------- environments and data


def bench_cache() -> Path:
    return Path(os.environ.get("LR_BENCH_CACHE") or Path.home() / ".cache" / "lr-bench")


def _python312() -> str:
    """A Python 3.12 for LeRobot's environment: $LR_BENCH_PYTHON312, pyenv's 3.12, python3.12 on
    PATH, else "3.12" (uv then finds or downloads one)."""
    if os.environ.get("LR_BENCH_PYTHON312"):
        return os.environ["LR_BENCH_PYTHON312"]
    if shutil.which("pyenv"):
        proc = subprocess.run(["pyenv", "prefix", "3.12"], capture_output=True, text=True, check=False)
        candidate = Path(proc.stdout.strip().splitlines()[-1]) / "bin" / "python" if proc.returncode == 0 and proc.stdout.strip() else None
        if candidate is not None and candidate.exists():
            return str(candidate)
    return shutil.which("python3.12") or "3.12"


def _uv_env() -> dict[str, str]:
    """The environment for uv commands that build LeRobot's venv: not this project's."""
    drop = ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT", "PYTHONPATH", "PYTHONHOME")
    return {k: v for k, v in os.environ.items() if k not in drop}


def lerobot_python() -> Path:
    """LeRobot 0.6.1's python, in a venv of its own under the bench cache (built once, as a user
    would: `uv venv -p 3.12` then `uv pip install 'lerobot[dataset,training]==0.6.1'`; LeRobot needs
    Python >= 3.12 and torch < 2.12, which this project's environment is not). This project's
    uv.lock is not involved."""
    venv = bench_cache() / f"lerobot-{LEROBOT_VERSION}"
    python, ready = venv / "bin" / "python", venv / ".lr-bench-ready"
    if ready.exists() and python.exists():
        return python
    uv = os.environ.get("UV") or shutil.which("uv")
    if uv is None:
        raise SystemExit("data_loading: uv is needed to build LeRobot's environment (run this with `uv run`)")
    print(f"data_loading: building LeRobot {LEROBOT_VERSION}'s environment in {venv} (once; about 2 minutes with a warm "
          f"uv cache, more on a cold one): uv venv, then uv pip install '{LEROBOT_SPEC}' ...", flush=True)
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    env, cwd = _uv_env(), venv.parent
    C.run_checked([uv, "venv", "--quiet", "-p", _python312(), str(venv)], timeout=600, env=env, cwd=cwd)
    C.run_checked([uv, "pip", "install", "--quiet", "--python", str(python), LEROBOT_SPEC], timeout=3600, env=env, cwd=cwd)
    C.run_checked([str(python), "-c", "import lerobot.datasets.lerobot_dataset, av"], timeout=600, env=env, cwd=cwd)
    ready.write_text(f"{LEROBOT_SPEC}\n")
    print(f"data_loading: LeRobot's environment is ready: {python}", flush=True)
    return python


# lr's demo generator (its AV1 encoder runs one level of parallelism: the SVT-AV1 in PyAV's
# wheels deadlocks at random frames with its own thread pool).
GENERATE = """
import sys
from pathlib import Path
from lr_engine import make_demo_dataset

height, width, cameras = int(sys.argv[1]), int(sys.argv[2]), tuple(sys.argv[3].split(","))
for root, episodes in zip(sys.argv[4::2], sys.argv[5::2]):
    make_demo_dataset(Path(root), num_episodes=int(episodes), with_images=True, video=True, cameras=cameras,
                      image_height=height, image_width=width)
"""


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_datasets(folder: Path, episodes: list[int], height: int, width: int) -> dict[int, Path]:
    """The demo as 2-camera video datasets of these episode counts, each generated once (under a
    temp name, then renamed), the missing ones in one subprocess (see GENERATE). It is watched:
    should the encoder deadlock all the same (every thread waiting, no CPU used for 20 s), it is
    stopped and started again, up to 5 times."""
    from lr_engine import DEMO_VERSION

    roots = {n: folder / f"video-2cam-{height}x{width}-{n}ep-v{DEMO_VERSION}" for n in episodes}
    folder.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 6):
        missing = [n for n, root in roots.items() if not (root / "meta" / "info.json").exists()]
        if not missing:
            return roots
        print(f"data_loading: generating {', '.join(roots[n].name for n in missing)} in {folder} (try {attempt}) ...", flush=True)
        tmp = Path(tempfile.mkdtemp(prefix=".generating-", dir=folder))
        cmd = [sys.executable, "-c", GENERATE, str(height), str(width), ",".join(CAMERAS)]
        cmd += [str(a) for n in missing for a in (tmp / str(n), n)]
        try:
            with tempfile.TemporaryFile("w+") as log:
                proc = subprocess.Popen(cmd, env=C.bench_env(), cwd=C.REPO, stdout=log, stderr=subprocess.STDOUT)
                cpu, idle = 0.0, 0.0
                while proc.poll() is None:
                    time.sleep(0.2)
                    try:
                        now = _cpu_seconds(proc.pid)
                    except OSError:
                        continue
                    idle = idle + 0.2 if now - cpu < 0.01 else 0.0
                    cpu = now
                    if idle >= 20:
                        proc.kill()
                        proc.wait()
                        print("data_loading: the generation used no CPU for 20 s (the AV1 encoder's deadlock); trying again", flush=True)
                        break
                for n in missing:  # the ones it completed (stats.json is written last)
                    if (tmp / str(n) / "meta" / "stats.json").exists():
                        os.replace(tmp / str(n), roots[n])
                if proc.returncode not in (0, -9) or (proc.returncode == -9 and idle < 20):
                    log.seek(0)
                    raise RuntimeError(f"generating datasets failed (exit {proc.returncode}):\n{log.read()[-4000:]}")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    raise RuntimeError(f"could not generate the datasets in {folder}: the AV1 encoder deadlocked 5 times")


def dataset_facts(root: Path) -> dict[str, Any]:
    info = json.loads((root / "meta" / "info.json").read_text())
    video = sum(p.stat().st_size for p in (root / "videos").rglob("*.mp4"))
    return {"episodes": int(info["total_episodes"]), "frames": int(info["total_frames"]), "video_mb": video / 2**20}


# ---------------------------------------------------------------- runs


class Runner:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args, self.tmp = args, tmp
        self.script = tmp / "loader_run.py"
        self.script.write_text(RUNNER)
        self.lr_cache = tmp / "lr-cache" if args.smoke else bench_cache() / "lr-cache"
        self.hf_home = bench_cache() / "hf"
        self.lerobot = None if args.smoke or args.no_lerobot else lerobot_python()
        self.versions: dict[str, Any] = {}

    def sides(self) -> list[str]:
        return ["lr"] + (["lerobot"] if self.lerobot is not None else [])

    def loader(self, side: str, root: Path, *, num_workers: int, batches: int, seed: int, sample_s: float = 0.0,
               check: list[int] | None = None, horizon: int | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"side": side, "root": str(root), "horizon": horizon or self.args.horizon, "batch_size": BATCH,
                                "num_workers": num_workers, "warmup": WARMUP_BATCHES, "batches": batches, "seed": seed,
                                "sample_s": sample_s, "repo_id": REPO_ID}
        if check:
            spec.update(check=check, check_out=str(self.tmp / f"check-{side}.npz"))
        if side == "lr":
            cmd, env, cwd = [sys.executable, str(self.script)], C.bench_env({"LR_CACHE_DIR": str(self.lr_cache)}), C.REPO
        else:
            assert self.lerobot is not None
            env = C.bench_env({"HF_HOME": str(self.hf_home), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
            for key in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
                env.pop(key, None)
            cmd, cwd = [str(self.lerobot), str(self.script)], self.tmp
        proc = C.run_checked([*cmd, json.dumps(spec)], timeout=1800, env=env, cwd=cwd, echo=False)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if not lines:
            raise RuntimeError(f"{side} loader printed no result:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
        self.versions[side] = result["versions"]
        return result

    def train(self, root: Path, num_workers: int, out: Path) -> list[dict[str, Any]]:
        from _act import SMOKE_ACT_FLAGS

        s = self.args
        policy = [f for f in SMOKE_ACT_FLAGS if not f.startswith(("--policy.chunk_size=", "--policy.n_action_steps="))] if s.smoke else [
            "--policy.type=act", "--policy.pretrained_backbone_weights=null"]
        flags = [*policy, f"--policy.chunk_size={s.horizon}",
                 f"--policy.n_action_steps={s.horizon}", f"--dataset.root={root}", f"--batch_size={BATCH}",
                 f"--num_workers={num_workers}", f"--steps={s.log_freq * (1 + s.windows)}", f"--log_freq={s.log_freq}",
                 "--save_checkpoint=false", f"--output_dir={out}"]
        C.run_checked([sys.executable, "-m", "lr_engine.cli", "train", *flags], timeout=3600,
                      env=C.bench_env({"LR_CACHE_DIR": str(self.lr_cache)}), echo=False)
        rows = [json.loads(line) for line in (out / METRICS).read_text().splitlines() if line.strip()]
        shutil.rmtree(out, ignore_errors=True)
        return rows


def prepare(runner: Runner, root: Path) -> dict[str, float]:
    """The first (untimed) run of each side on a dataset, which makes their caches of its data file,
    and both loaders' items for a few frames (in-process): the largest difference per key."""
    facts = dataset_facts(root)
    picks = sorted({0, 1, facts["frames"] // 3, facts["frames"] // 2, facts["frames"] - 1})
    for side in runner.sides():
        print(f"prepare {root.name}: {side} (untimed first run; items {picks})", flush=True)
        runner.loader(side, root, num_workers=0, batches=2, seed=0, check=picks)
    if runner.lerobot is None:
        return {}
    import numpy as np

    a, b = np.load(runner.tmp / "check-lr.npz"), np.load(runner.tmp / "check-lerobot.npz")
    return {k: float(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)).max()) for k in a.files}


def measure_throughput(runner: Runner, root: Path) -> list[dict[str, Any]]:
    rows = []
    for repeat in range(runner.args.repeats):
        for horizon in runner.args.horizons:
            for workers in runner.args.workers:
                sides = runner.sides() if repeat % 2 == 0 else list(reversed(runner.sides()))
                for side in sides:
                    res = runner.loader(side, root, num_workers=workers, batches=runner.args.batches, seed=repeat, horizon=horizon)
                    print(f"throughput repeat {repeat} window {horizon} workers {workers} {side}: {res['samples_per_s']:.1f} samples/s",
                          flush=True)
                    rows.append({"repeat": repeat, "workers": workers, "horizon": horizon, **res})
    return rows


def measure_stall(runner: Runner, root: Path) -> list[dict[str, Any]]:
    rows = []
    for repeat in range(runner.args.stall_repeats):
        for workers in runner.args.workers if repeat % 2 == 0 else list(reversed(runner.args.workers)):
            metrics = runner.train(root, workers, runner.tmp / f"train-w{workers}-r{repeat}")
            for window, m in enumerate(metrics[1:], start=2):  # the first window is the warm-up
                rows.append({"repeat": repeat, "workers": workers, "window": window, "update_s": m["update_s"],
                             "dataloading_s": m["dataloading_s"], "samples_per_s": m["samples_per_s"]})
            share = [r["dataloading_s"] / (r["update_s"] + r["dataloading_s"]) for r in rows if r["repeat"] == repeat and r["workers"] == workers]
            print(f"stall repeat {repeat} workers {workers}: {C.median(share):.3f} of step time waiting for data", flush=True)
    return rows


def measure_memory(runner: Runner, roots: dict[int, Path]) -> list[dict[str, Any]]:
    rows = []
    sides = runner.sides() if runner.args.memory_lerobot else ["lr"]
    for repeat in range(runner.args.memory_repeats):
        for size in list(roots) if repeat % 2 == 0 else list(reversed(roots)):
            for side in sides:
                res = runner.loader(side, roots[size], num_workers=runner.args.memory_workers, batches=runner.args.memory_batches,
                                    seed=100 + repeat, sample_s=0.05)
                print(f"memory repeat {repeat} {size}x {side}: main {res['main_hwm'] / 2**20:.0f} MiB, workers "
                      f"{[round(w / 2**20) for w in res['worker_hwm']]} MiB", flush=True)
                rows.append({"repeat": repeat, "size": size, **res})
    return rows


# ---------------------------------------------------------------- the section


def _mib(values: list[float]) -> str:
    return C.spread([v / 2**20 for v in values], "{:.0f}")


def _throughput_table(rows: list[dict[str, Any]], smoke: bool) -> tuple[str, dict[tuple[int, int], float]]:
    out, ratios_by = [], {}
    for horizon, w in dict.fromkeys((r["horizon"], r["workers"]) for r in rows):
        lr = {r["repeat"]: r for r in rows if (r["horizon"], r["workers"]) == (horizon, w) and r["side"] == "lr"}
        le = {r["repeat"]: r for r in rows if (r["horizon"], r["workers"]) == (horizon, w) and r["side"] == "lerobot"}
        lr_sps = [r["samples_per_s"] for r in lr.values()]
        if le:
            ratios = [lr[k]["samples_per_s"] / le[k]["samples_per_s"] for k in lr if k in le]
            ratios_by[(horizon, w)] = C.median(ratios)
            le_cells = [C.spread([r["samples_per_s"] for r in le.values()], "{:.1f}"), C.spread(ratios, "{:.2f}"),
                        f">= {TARGET}", C.verdict(C.median(ratios) >= TARGET)]
            build = f"{C.spread([r['build_s'] for r in lr.values()], '{:.2f}')} / {C.spread([r['build_s'] for r in le.values()], '{:.2f}')}"
        else:
            skipped = "skipped (--smoke)" if smoke else "not measured (--no-lerobot)"
            le_cells = [skipped, "-", f">= {TARGET}", ""]
            build = f"{C.spread([r['build_s'] for r in lr.values()], '{:.2f}')} / -"
        out.append([horizon, w, C.spread(lr_sps, "{:.1f}"), *le_cells, build])
    headers = ["action window", "num_workers", "lr samples/s", "LeRobot samples/s", "lr / LeRobot (paired)", "target", "",
               "dataset construction s, lr / LeRobot"]
    return C.table(headers, out), ratios_by


def _stall_table(rows: list[dict[str, Any]], workers: list[int]) -> tuple[str, dict[int, dict[str, float]]]:
    out, summary = [], {}
    for w in workers:
        mine = [r for r in rows if r["workers"] == w]
        share = [r["dataloading_s"] / (r["update_s"] + r["dataloading_s"]) for r in mine]
        summary[w] = {"share": C.median(share), "update_s": C.median(r["update_s"] for r in mine),
                      "data_s": C.median(r["dataloading_s"] for r in mine), "sps": C.median(r["samples_per_s"] for r in mine)}
        out.append([w, C.spread(share), C.spread([r["dataloading_s"] for r in mine]), C.spread([r["update_s"] for r in mine]),
                    C.spread([r["samples_per_s"] for r in mine], "{:.1f}")])
    return C.table(["num_workers", "share of step time waiting for data", "dataloading_s per step", "update_s per step", "samples/s"], out), summary


def _peak(row: dict[str, Any], what: str) -> float:
    """A memory run's peak: the main process's RSS, the largest worker's, or all processes' PSS."""
    return float({"main": row["main_hwm"], "worker": max(row["worker_hwm"] or [0]), "pss_sum": row["pss_sum"]}[what])


def _memory_table(rows: list[dict[str, Any]], facts: dict[int, dict[str, Any]]) -> tuple[str, dict[str, tuple[float, float]]]:
    out, flat = [], {}
    sides = [s for s in ("lr", "lerobot") if any(r["side"] == s for r in rows)]
    for side in sides:
        for size, f in facts.items():
            mine = [r for r in rows if r["side"] == side and r["size"] == size]
            worker_hwm = [max(r["worker_hwm"]) for r in mine if r["worker_hwm"]]
            worker_anon = [max(r["worker_anon"]) for r in mine if r["worker_anon"]]
            out.append([{"lr": "lr", "lerobot": "LeRobot 0.6.1"}[side], f"{size}x: {f['episodes']} episodes, {f['frames']} frames, {f['video_mb']:.1f} MB of video",
                        _mib([r["main_hwm"] for r in mine]), _mib(worker_hwm) if worker_hwm else "-",
                        _mib([r["main_anon"] for r in mine]), _mib(worker_anon) if worker_anon else "-",
                        _mib([r["pss_sum"] for r in mine])])
        first, last = min(facts), max(facts)
        for what in ("main", "worker", "pss_sum"):
            lo = C.median(_peak(r, what) for r in rows if r["side"] == side and r["size"] == first)
            hi = C.median(_peak(r, what) for r in rows if r["side"] == side and r["size"] == last)
            if lo > 0:
                flat[f"{side}:{what}"] = (lo, hi)
    headers = ["loader", "dataset", "main peak RSS MiB", "worker peak RSS MiB (largest)", "main peak anon MiB",
               "worker peak anon MiB (largest)", "peak PSS MiB, all processes"]
    return C.table(headers, out), flat


def _stall_bound(stall: dict[int, dict[str, float]], throughput: list[dict[str, Any]], horizon: int) -> str:
    """What bounds the stall on this machine, from the numbers measured."""
    cores = os.cpu_count() or 1

    def lr_rate(w: int) -> float:
        return C.median(r["samples_per_s"] for r in throughput if r["side"] == "lr" and r["workers"] == w and r["horizon"] == horizon)

    lr0 = lr_rate(0)
    decode, s0 = BATCH / lr0, stall[0]
    text = (f"What bounds it on {cores} cores: at num_workers 0 the training process decodes each batch itself between updates: "
            f"{decode:.3f} s per batch at the loader's own rate ({BATCH} / {lr0:.1f} samples/s, the throughput table), against "
            f"{s0['update_s']:.3f} s of update on one core (OMP_NUM_THREADS=1); the measured wait, {s0['data_s']:.3f} s "
            f"({s0['share']:.1%} of the step), is that decoding.")
    for w in sorted(k for k in stall if k > 0):
        sw, spare = stall[w], max(cores - 1, 1)
        per_step = decode / spare
        rate = lr_rate(w) if any(r["workers"] == w and r["horizon"] == horizon for r in throughput) else float("nan")
        floor = max(s0["update_s"], (s0["update_s"] + decode) / cores)
        text += (
            f" With num_workers {w} the workers decode while the update runs, but on the same {cores} cores: beside the update's "
            f"core they have {spare}, where a batch takes about {per_step:.3f} s, {'less' if per_step < s0['update_s'] else 'more'} "
            f"than an update, so the wait falls to {sw['data_s']:.3f} s ({sw['share']:.1%}); what remains is the training process "
            f"receiving each batch from a worker (shared-memory tensors) and the moments when the workers take the update's core, "
            f"which also shows in update_s ({s0['update_s']:.3f} s -> {sw['update_s']:.3f} s). No loader can make a step shorter "
            f"than max(update, (update + decoding) / {cores} cores) = {floor:.3f} s here; the update alone is the larger, so on "
            f"this machine the update, not the loader, sets the pace: training runs at {sw['sps']:.1f} samples/s, while lr's "
            f"loader alone delivers {rate:.1f} samples/s with {w} workers (throughput table). A faster update (a GPU) moves "
            "the bound to the loader: on 2 cores, that table's rate."
        )
        step0, stepw = s0["update_s"] + s0["data_s"], sw["update_s"] + sw["data_s"]
        text += (f" Whole steps: {step0:.3f} s at num_workers 0 against {stepw:.3f} s at {w}: the workers save "
                 f"{s0['data_s'] - sw['data_s']:.3f} s of waiting per step and the update "
                 f"{'loses' if sw['update_s'] > s0['update_s'] else 'gains'} {abs(sw['update_s'] - s0['update_s']):.3f} s "
                 "(the update_s ranges overlap: on a machine shared with other work that part is within the noise).")
    return text


def _section(args: argparse.Namespace, res: dict[str, Any]) -> str:
    facts, base = res["facts"], res["facts"][res["throughput_size"]]
    lr_v = res["lr_versions"]
    le_v = res.get("lerobot_versions")
    body = [
        f"The dataset: lr's demo (a 2-D reaching task, episodes of 40-60 frames at 10 fps) written as a LeRobot v3 video "
        f"dataset with 2 cameras (`observation.images.top` and `.wrist`, {args.height}x{args.width} RGB, one AV1 MP4 per camera "
        "as LeRobot's writer encodes it: libsvtav1, yuv420p, g=2, crf=30), plus state, environment state and action (2 floats "
        f"each). Throughput and the training runs use the {res['throughput_size']}x dataset: {base['episodes']} episodes, "
        f"{base['frames']} frames, {base['video_mb']:.1f} MB of video. Both loaders read the same folder with PyAV "
        f"(`video_backend=\"pyav\"`: torchcodec needs a system FFmpeg), return float32 frames in [0, 1] and an action window "
        f"of {args.horizon} unless a table says otherwise ({HORIZON} is LeRobot's ACT chunk_size; lr: `action_horizon={args.horizon}`, "
        f"LeRobot: `delta_timestamps={{\"action\": [i / fps for i in range({args.horizon})]}}`) with its padding mask.",
        "",
        f"Versions of the two sides: lr runs in this project's environment (Python {lr_v['python']}, torch {lr_v['torch']}, "
        f"PyAV {lr_v['av']}); " + (f"LeRobot {le_v['lerobot']} in its own (Python {le_v['python']}, torch {le_v['torch']}, "
                                   f"PyAV {le_v['av']}), built by this command with uv under `~/.cache/lr-bench/` "
                                   f"(`uv pip install '{LEROBOT_SPEC}'`)." if le_v else
                                   "LeRobot was not run (" + ("--smoke: the LeRobot side is skipped, so no environment is built"
                                                               if args.smoke else "--no-lerobot") + ")."),
        "",
        "### Throughput",
        "",
        f"Samples/s of `torch.utils.data.DataLoader(dataset, batch_sampler=..., num_workers=N)`: batch {BATCH}, shuffled (one numpy "
        f"permutation per repeat, the same batches for both loaders), {WARMUP_BATCHES} warm-up batches then {args.batches} "
        f"timed ones ({args.batches * BATCH} samples), each run a fresh process with OMP_NUM_THREADS=1; `median (min-max, n)` "
        f"over {args.repeats} repeats, lr and LeRobot alternating (order reversed on odd repeats); the ratio is the median of "
        f"the paired ratios. Action windows: {' and '.join(str(h) for h in args.horizons)} ({HORIZON}: LeRobot's ACT chunk_size, "
        "the window of every other part of this section; 10: lr's ACT default). Dataset construction (the constructor's time, "
        "caches already made by an untimed first run) is shown for context; it is not in the samples/s.",
        "",
    ]
    if res.get("throughput"):
        table, ratios = _throughput_table(res["throughput"], args.smoke)
        body += [table, ""]
        if res.get("check"):
            diffs = ", ".join(f"`{k}` {v:.3g}" for k, v in res["check"].items())
            same = all(v <= 1e-6 for v in res["check"].values())
            body += [f"Same items: for 5 frames (first, last and between), the largest difference between the two loaders' "
                     f"values per key: {diffs}" + (" (identical)." if same else "."), ""]
        if ratios:
            missed = [k for k, r in ratios.items() if r < TARGET]
            body += [("Target met in every row: " if not missed else f"**Target missed** in {len(missed)} of {len(ratios)} rows: ") +
                     ", ".join(f"{r:.2f}x (window {h}, num_workers {w})" for (h, w), r in ratios.items()) +
                     f"; target >= {TARGET}x.", ""]
    else:
        body += ["Not measured in this run.", ""]
    body += [
        "### Training stall",
        "",
        f"`lr-engine train` of ACT with both cameras (the default ACT: dim_model 128, conv backbone [16, 32, 64]; "
        f"chunk_size {args.horizon}), batch {BATCH}, single process on CPU, OMP_NUM_THREADS=1, on the same dataset; "
        f"{args.log_freq * (1 + args.windows)} steps logged every {args.log_freq}, the first window (warm-up) left out, "
        f"{args.stall_repeats} repeats alternating the num_workers settings. Share = `dataloading_s / (update_s + "
        "dataloading_s)` of each metrics.jsonl window (the engine's own timing: the wait for the next batch, and the rest of "
        "the step); `median (min-max, n)` over windows x repeats.",
        "",
    ]
    if res.get("stall"):
        table, stall = _stall_table(res["stall"], args.workers)
        body += [table, ""]
        if 0 in stall and any(r["horizon"] == args.horizon and r["workers"] == 0 for r in res.get("throughput") or []):
            body += [_stall_bound(stall, res["throughput"], args.horizon), ""]
    else:
        body += ["Not measured in this run.", ""]
    body += [
        "### Memory",
        "",
        f"Peak memory while iterating {args.memory_batches + WARMUP_BATCHES} random batches of {BATCH} with num_workers "
        f"{args.memory_workers}, datasets of {', '.join(f'{s}x' for s in res['sizes'])} (fresh processes, {args.memory_repeats} "
        "repeats, sizes alternating). Peak RSS is the kernel's VmHWM of the loading (main) process and of the largest worker; "
        "anonymous RSS (RssAnon: the heap, not the mapped files and libraries) and the summed PSS of all the processes "
        "(shared pages counted once) are sampled every 50 ms. The workers are forked from the main process, so their RSS "
        "includes the pages they share with it (torch's libraries above all). `median (min-max, n)`.",
        "",
    ]
    if res.get("memory"):
        table, flat = _memory_table(res["memory"], {s: facts[s] for s in res["sizes"]})
        body += [table, ""]
        verdicts = []
        for key, (lo, hi) in flat.items():
            side, what = key.split(":")
            ok = hi <= lo * (1 + FLAT)
            verdicts.append(f"{'lr' if side == 'lr' else 'LeRobot'} {what.replace('pss_sum', 'PSS of all processes')}: "
                            f"{lo / 2**20:.0f} -> {hi / 2**20:.0f} MiB ({(hi - lo) / 2**20:+.0f} MiB, {hi / lo - 1:+.1%}) "
                            f"{'flat' if ok else '**not flat**'}")
        body += [f"From {min(res['sizes'])}x to {max(res['sizes'])}x (flat: within {FLAT:.0%} of the {min(res['sizes'])}x "
                 "peak): " + "; ".join(verdicts) + ".", ""]
    else:
        body += ["Not measured in this run.", ""]
    return "\n".join(body)


# ---------------------------------------------------------------- main


def main() -> None:
    def extra(p: argparse.ArgumentParser) -> None:
        p.add_argument("--episodes", type=int, default=25, help="episodes of the 1x dataset (default 25)")
        p.add_argument("--throughput-size", type=int, default=4, help="which size (a multiple of --episodes) throughput and training use (default 4)")
        p.add_argument("--batches", type=int, default=50, help="timed batches per loading run (default 50)")
        p.add_argument("--horizon", type=int, default=HORIZON, help=f"action window (default {HORIZON}, LeRobot's ACT chunk_size)")
        p.add_argument("--horizons", default=f"{HORIZON},10", help=f"action windows of the throughput runs (default {HORIZON},10)")
        p.add_argument("--workers", default="0,2", help="num_workers settings for throughput and training (default 0,2)")
        p.add_argument("--stall-repeats", type=int, default=None, help="training runs per num_workers setting (default 2)")
        p.add_argument("--log-freq", type=int, default=8, help="training log window in steps (default 8)")
        p.add_argument("--windows", type=int, default=5, help="training windows after the warm-up one (default 5)")
        p.add_argument("--memory-repeats", type=int, default=None, help="memory runs per size (default 2)")
        p.add_argument("--memory-batches", type=int, default=150, help="batches of each memory run (default 150)")
        p.add_argument("--memory-workers", type=int, default=2, help="num_workers of the memory runs (default 2)")
        p.add_argument("--no-memory-lerobot", dest="memory_lerobot", action="store_false", help="memory: lr only")
        p.add_argument("--no-lerobot", action="store_true", help="lr only (no LeRobot environment)")
        p.add_argument("--parts", default="throughput,stall,memory", help="what to measure (default all)")
        p.add_argument("--height", type=int, default=HEIGHT)
        p.add_argument("--width", type=int, default=WIDTH)

    args = C.parse_args(__doc__.splitlines()[0], extra)
    parts = set(args.parts.split(","))
    args.workers = [int(w) for w in args.workers.split(",")]
    args.horizons = [int(h) for h in args.horizons.split(",")]
    if args.smoke:
        args.repeats, args.stall_repeats, args.memory_repeats = 1, 1, 1
        args.episodes, args.throughput_size, args.batches, args.height, args.width = 2, 1, 3, 24, 32
        args.log_freq, args.windows, args.horizon, args.workers, args.memory_batches = 2, 1, 10, [0], 3
        args.horizons = [10]
        sizes: tuple[int, ...] = (1, 2)
    else:
        args.repeats = args.repeats or 5
        args.stall_repeats = args.stall_repeats or 2
        args.memory_repeats = args.memory_repeats or 2
        sizes = SIZES
    ctx = C.Context.now()
    if args.smoke:
        print("data_loading --smoke: tiny sizes, lr only: the LeRobot side is skipped (no environment build, no network)", flush=True)
    with tempfile.TemporaryDirectory(prefix="lr-bench-data-") as tmp_name:
        tmp = Path(tmp_name)
        data_dir = tmp / "datasets" if args.smoke else bench_cache() / "datasets"
        all_sizes = sorted(set(sizes) | {args.throughput_size})
        made = make_datasets(data_dir, [args.episodes * s for s in all_sizes], args.height, args.width)
        roots = {s: made[args.episodes * s] for s in all_sizes}
        runner = Runner(args, tmp)
        res: dict[str, Any] = {"facts": {s: dataset_facts(r) for s, r in roots.items()}, "sizes": list(sizes),
                               "throughput_size": args.throughput_size}
        main_root = roots[args.throughput_size]
        # the untimed first runs (in --smoke, the first measured runs make the caches instead)
        res["check"] = {} if args.smoke else prepare(runner, main_root)
        if "throughput" in parts:
            res["throughput"] = measure_throughput(runner, main_root)
        if "stall" in parts:
            res["stall"] = measure_stall(runner, main_root)
        if "memory" in parts:
            for s in sizes:
                if s != args.throughput_size and not args.smoke:
                    prepare(runner, roots[s])
            res["memory"] = measure_memory(runner, {s: roots[s] for s in sizes})
        res["lr_versions"], res["lerobot_versions"] = runner.versions.get("lr"), runner.versions.get("lerobot")
        (Path(tempfile.gettempdir()) / "lr-bench-data_loading.json").write_text(json.dumps(res, indent=1, default=str))
    flags = [a for a in sys.argv[1:] if not a.startswith(("--out", "--smoke"))]
    C.write_section(args.out, "data_loading", f"8. Data loading: lr's LeRobotDataset vs LeRobot {LEROBOT_VERSION}'s, on a video dataset",
                    C.command_line("data_loading.py", args, flags), ctx, _section(args, res), args.smoke)


if __name__ == "__main__":
    main()
