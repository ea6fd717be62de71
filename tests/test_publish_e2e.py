"""End to end: a 2-process FSDP2 `lr-engine train --policy.push_to_hub=true` lands the model on
the loopback Hub exactly once, from the main rank, byte-identical to the local publish folder."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from _support.procs import run_ranks, subprocess_env

pytestmark = pytest.mark.multiprocess

TOKEN = "hf_e2eTestToken0123456789abcdef"


def test_fsdp2_run_publishes_once_from_the_main_rank(hub_server, tmp_path: Path, demo_dataset: Path) -> None:
    out = tmp_path / "run"
    proc = run_ranks(
        2,
        ["train", f"--output_dir={out}", f"--dataset.root={demo_dataset}", "--policy.dim_model=32", "--policy.dim_feedforward=64",
         "--policy.n_heads=2", "--steps=4", "--batch_size=4", "--parallelism.dp_shard=2", "--save_freq=4",
         "--policy.repo_id=lr-tests/act-e2e", f"--hub.endpoint={hub_server.endpoint}"],  # a repo id alone pushes, as in LeRobot
        env={"HF_TOKEN": TOKEN, "HF_HUB_DISABLE_XET": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count("Model pushed to") == 1
    assert "publish: the trained model goes to the Hub as lr-tests/act-e2e at the end" in proc.stdout
    commits = [p for p in hub_server.paths_requested("POST") if "/commit/" in p]
    assert len(commits) == 1
    uploaded = hub_server.files("lr-tests/act-e2e")
    folders = list((out / "publish").iterdir())
    assert len(folders) == 1
    local = {str(p.relative_to(folders[0])): p.read_bytes() for p in folders[0].rglob("*") if p.is_file()}
    assert uploaded == local
    assert {"model.safetensors", "config.json", "train_config.json", "README.md", "policy_preprocessor.json"} <= set(uploaded)
    assert not any("fsdp" in name or "training_state" in name or "optimizer" in name for name in uploaded)
    card = ModelCard(uploaded["README.md"].decode())
    assert card.data.pipeline_tag == "robotics" and "act" in card.data.tags
    for path in out.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
    assert TOKEN not in proc.stdout + proc.stderr
    assert json.loads((out / "run.json").read_text())["status"] == "finished"


def test_a_run_stopped_early_publishes_where_it_stopped(hub_server, tmp_path: Path, demo_dataset: Path) -> None:
    """SIGINT at some step S of 100000: the published card, training_step and folder name say S, not 100000."""
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "lr_engine.cli", "train", f"--output_dir={out}", f"--dataset.root={demo_dataset}",
            "--policy.dim_model=32", "--policy.dim_feedforward=64", "--policy.n_heads=2", "--steps=100000", "--batch_size=4",
            "--log_freq=1", "--policy.push_to_hub=true", "--policy.repo_id=lr-tests/act-stopped", f"--hub.endpoint={hub_server.endpoint}"]
    proc = subprocess.Popen(argv, env=subprocess_env({"HF_TOKEN": TOKEN, "HF_HUB_DISABLE_XET": "1"}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().count("\n") >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, stdout[-2000:] + stderr[-3000:]  # stopped on request, resumable
    status = json.loads((out / "run.json").read_text())
    stopped = status["step"]
    assert status["status"] == "stopped" and 2 <= stopped < 100000
    folders = list((out / "publish").iterdir())
    assert len(folders) == 1 and folders[0].name.endswith(f"{stopped:06d}"), folders
    uploaded = hub_server.files("lr-tests/act-stopped")
    card = uploaded["README.md"].decode()
    assert f"| steps | {stopped} loop steps (micro-batches per process) of 100000 planned |" in card
    assert f"| samples seen | {stopped * 4} |" in card


def test_a_push_that_fails_at_the_end_keeps_the_run_finished_and_ends_with_the_retry(hub_server, tmp_path: Path, demo_dataset: Path) -> None:
    """The Hub goes down as the run pushes: the run is finished (its files are whole), the last lines say how
    to retry the push, and the exit code is not 0."""
    from _support.procs import run_cli

    hub_server.outage_on("/commit/")
    out = tmp_path / "run"
    proc = run_cli(["lr_engine.cli", "train", f"--output_dir={out}", f"--dataset.root={demo_dataset}", "--policy.dim_model=32",
                    "--policy.dim_feedforward=64", "--policy.n_heads=2", "--steps=2", "--batch_size=4", "--policy.repo_id=lr-tests/act-down",
                    f"--hub.endpoint={hub_server.endpoint}"],
                   env={"HF_TOKEN": TOKEN, "HF_HUB_DISABLE_XET": "1", "LR_HUB_RETRIES": "1", "LR_HUB_RETRY_BASE_S": "0"})
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert json.loads((out / "run.json").read_text())["status"] == "finished"
    last = proc.stderr.strip().splitlines()
    assert last[-2] == "Retry the push with:" and last[-1].strip().startswith("lr-publish --folder="), last[-4:]
