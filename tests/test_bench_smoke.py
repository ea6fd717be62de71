"""The benchmarks in tools/bench still run: each at its tiny `--smoke` size, into a temp file.

A smoke run measures nothing; it proves the script, its workers and its BENCHMARKS.md
section still work with the current packages, so the real runs do not rot between
releases. gpu_throughput runs as-is here (on a machine without CUDA it must write a "not
measured" section and exit 0); its measuring code path runs in the GPU device script's CPU
dry-check below (`--device=cpu` at the smoke size).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "tools" / "bench"
sys.path.insert(0, str(BENCH))

import _common  # noqa: E402

from _support.procs import run_cli  # noqa: E402

CASES = [
    ("engine_overhead", []),
    ("memory_fsdp", []),
    ("checkpoint_io", []),
    ("async_save", []),
    ("converter", []),
    ("startup", []),
    ("gpu_throughput", []),
    ("data_loading", []),
    ("verify_scaling", []),
    ("eval_success", []),
    ("vs_lerobot_train", []),
]


def _section(text: str, name: str) -> str:
    begin, end = f"<!-- bench:{name} -->\n", f"<!-- /bench:{name} -->"
    assert text.count(begin) == 1 and text.count(end) == 1, f"section {name} missing or repeated"
    return text.split(begin, 1)[1].split(end, 1)[0]


@pytest.mark.multiprocess
@pytest.mark.parametrize(("name", "flags"), CASES, ids=[n + "".join(f) for n, f in CASES])
def test_benchmark_smoke_run_writes_its_section(tmp_path: Path, name: str, flags: list[str]) -> None:
    out = tmp_path / "BENCHMARKS.md"
    # the script's own process forks from one that imported torch already (run_cli); its workers start as it starts them
    proc = run_cli([str(BENCH / f"{name}.py"), "--smoke", f"--out={out}", *flags], env=_common.bench_env(), timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    section = _section(out.read_text(), name)
    assert "SMOKE RUN" in section
    assert f"uv run python tools/bench/{name}.py --smoke" in section
    if name == "gpu_throughput" and not flags:
        import torch

        assert ("Not measured in this run" in section) != torch.cuda.is_available()
    else:
        assert "\n| " in section and "nan" not in section, section


def test_write_section_replaces_its_own_section_and_keeps_the_others(tmp_path: Path) -> None:
    out = tmp_path / "B.md"
    ctx = _common.Context.now()
    _common.write_section(out, "startup", "6. S", "cmd-s", ctx, "first startup body", smoke=False)
    _common.write_section(out, "engine_overhead", "1. E", "cmd-e", ctx, "engine body", smoke=True)
    _common.write_section(out, "startup", "6. S", "cmd-s", ctx, "second startup body", smoke=False)
    text = out.read_text()
    assert text.index("bench:engine_overhead") < text.index("bench:startup"), "sections keep the canonical order"
    assert "second startup body" in _section(text, "startup") and "first startup body" not in text
    assert "engine body" in _section(text, "engine_overhead") and "SMOKE RUN" in _section(text, "engine_overhead")
    assert "SMOKE RUN" not in _section(text, "startup")
    assert "- Command: `cmd-s`" in _section(text, "startup")
    # a hand-written part outside the sections survives every rewrite, at the end
    out.write_text(text + "\n## What was changed\n\nBy hand.\n")
    _common.write_section(out, "startup", "6. S", "cmd-s", ctx, "third startup body", smoke=False)
    _common.write_section(out, "engine_overhead", "1. E", "cmd-e", ctx, "engine body", smoke=False)
    text = out.read_text()
    assert text.endswith("## What was changed\n\nBy hand.\n") and text.count("By hand.") == 1
    assert "third startup body" in _section(text, "startup")
    # and a hand-written index before the first section stays before it
    first = text.index("<!-- bench:")
    out.write_text(text[:first] + "## Targets and status\n\nAn index.\n\n" + text[first:])
    _common.write_section(out, "startup", "6. S", "cmd-s", ctx, "fourth startup body", smoke=False)
    text = out.read_text()
    assert text.index("An index.") < text.index("<!-- bench:engine_overhead") and text.count("An index.") == 1
    assert text.endswith("## What was changed\n\nBy hand.\n") and text.count("By hand.") == 1


def _gpu_device_run(out: Path, runs: Path, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    cache = os.environ.get("LR_CACHE_DIR", str(Path.home() / ".cache" / "lr"))
    env = _common.bench_env({"OUT": str(out), "LR_GPU_DEVICE": "cpu", "PYTHON": sys.executable, "LR_GPU_RUNS": str(runs),
                             "LR_CACHE_DIR": cache, "LR_BENCH_COMMIT": "abc1234", "LR_GPU_WHEELS": str(out / "no-wheels"),
                             **(extra or {})})
    return subprocess.run(["bash", str(BENCH / "gpu_device.sh"), "run"], env=env, capture_output=True, text=True, timeout=600, cwd=REPO)


@pytest.mark.multiprocess
def test_gpu_device_script_runs_from_the_sources(tmp_path: Path) -> None:
    """tools/bench/gpu_device.sh, the one command a session with a lent GPU runs there, in its
    CPU dry-check mode: lr imported from packages/*/src through PYTHONPATH (the GPU machine
    has no uv), section 7 at the smoke size, then the engine's bf16 run, a resume from its
    checkpoint and an fp16 run."""
    out = tmp_path / "out"
    proc = _gpu_device_run(out, tmp_path / "runs")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    section = _section((out / "BENCHMARKS.md").read_text(), "gpu_throughput")
    assert "- Command: `bash tools/bench/gpu_device.sh run`" in section and "(git abc1234)" in section
    assert "\n| 2 | " in section
    engine = (out / "engine.log").read_text()
    assert "identical: True" in engine and "engine checks: passed" in engine
    assert "done: no checkpoints (--save_checkpoint=false)" in engine


@pytest.mark.multiprocess
def test_gpu_device_script_fails_when_an_engine_check_fails(tmp_path: Path) -> None:
    """A failed `lr-engine train` stops the checks and fails the command (the device run's
    result must not say "passed" over a failure)."""
    (tmp_path / "file").write_text("")
    out = tmp_path / "out"
    # no run folder can be made below a file; section 7 is left out (the test above runs it)
    proc = _gpu_device_run(out, tmp_path / "file" / "runs", {"LR_GPU_SKIP_THROUGHPUT": "1"})
    assert proc.returncode != 0
    engine = (out / "engine.log").read_text()
    assert "engine checks: FAILED (exit 2)" in engine and "engine checks: passed" not in engine
    assert "== resumed" not in engine  # nothing ran after the failed command
