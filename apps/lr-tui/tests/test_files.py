"""Reading a run from files: metrics tail, run status, checkpoints and safetensors headers."""

from __future__ import annotations

import json
import math
import struct
import sys
from dataclasses import replace

import pytest
from tui_support import make_checkpoint, metrics_line, metrics_record, point_last, write_run_status, write_weights

from lr_config import RunStatus, to_dict
from lr_tui import _cli_tasks as cli_tasks
from lr_tui import _run_info as run_info
from lr_tui._checkpoint_scan import checkpoint_details, scan_checkpoints
from lr_tui._metrics_tail import JsonlTail, MetricsTail, last_record
from lr_tui._run_info import eta_seconds, log_tail, summarize_run
from lr_config import CheckpointError
from lr_tui._safetensors_header import summarize_tensors
from lr_tui._series import downsample, format_bytes, format_duration


def test_tail_keeps_a_partial_line_for_the_next_read(tmp_path):
    path = tmp_path / "m.jsonl"
    tail = JsonlTail(path)
    assert tail.read() == ([], False)
    path.write_bytes(b'{"a": 1}\n{"b"')
    assert tail.read() == ([b'{"a": 1}'], False)
    with path.open("ab") as f:
        f.write(b': 2}\n\n{"c": 3}\n')
    assert tail.read() == ([b'{"b": 2}', b'{"c": 3}'], False)
    assert tail.read() == ([], False)


def test_tail_starts_over_when_the_file_shrinks_or_is_replaced(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}\n')
    tail = JsonlTail(path)
    tail.read()
    path.write_bytes(b'{"x": 1}\n')
    assert tail.read() == ([b'{"x": 1}'], True)
    replacement = tmp_path / "new.jsonl"
    replacement.write_bytes(b'{"y": 1}\n{"y": 2}\n')
    replacement.replace(path)
    assert tail.read() == ([b'{"y": 1}', b'{"y": 2}'], True)


def test_metrics_tail_parses_records_and_reports_bad_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(metrics_line(5) + "not json\n" + json.dumps({"version": 9}) + "\n" + metrics_line(10))
    read = MetricsTail(path).read()
    assert [r.step for r in read.records] == [5, 10]
    assert read.problems[0].startswith("metrics.jsonl:2: not valid JSON")
    assert read.problems[1] == "metrics.jsonl:3: unsupported metrics record version"


def test_last_record_reads_the_end_and_skips_what_is_not_a_record(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert last_record(path) is None
    path.write_text('{"step": 1')
    assert last_record(path) is None  # nothing complete yet
    path.write_text(metrics_line(5) + metrics_line(10) + "not json\n" + json.dumps({"version": 9}) + "\n" + '{"step": 1')
    assert last_record(path).step == 10  # type: ignore[union-attr]
    path.write_text("".join(metrics_line(s) for s in range(1, 400)))
    got = last_record(path, tail_bytes=700)  # the window cuts the first line it holds
    assert got is not None and got.step == 399


def test_run_summary_eta_and_failure_log(tmp_path, monkeypatch):
    # run.json says running on another host at a fixed time: not stale however long ago that is
    monkeypatch.setattr(run_info, "STALE_AFTER_S", math.inf)
    assert summarize_run(tmp_path).state == "no run.json yet"
    write_run_status(tmp_path, step=200, steps=300)
    paced = replace(metrics_record(200), update_s=0.9, dataloading_s=0.1)  # 1 s per step
    (tmp_path / "metrics.jsonl").write_text(metrics_line(195) + json.dumps(to_dict(paced)) + "\n" + '{"step": 2')
    summary = summarize_run(tmp_path)
    assert summary.line() == "running   step 200/300 (66%)   ETA 1m40s"  # the last complete record's pace
    write_run_status(tmp_path, status="failed", error="RuntimeError: boom")
    assert summarize_run(tmp_path).error == "RuntimeError: boom"
    assert eta_seconds(RunStatus(status="running", step=0, steps=10)) is None
    # without metrics: the pace from started to updated
    fresh = RunStatus(status="running", step=200, steps=300, started="2025-01-01T12:00:00", updated="2025-01-01T12:01:40")
    assert eta_seconds(fresh) == pytest.approx(50.0)
    # resumed at step 1000: run.json's step counts the steps before the resume, its clock does not
    resumed = replace(fresh, step=1010, steps=2000, updated="2025-01-01T12:00:10")
    assert eta_seconds(resumed, paced) == pytest.approx(990.0)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "launch.log").write_text("".join(f"line {i}\n" for i in range(50)))
    path, text = log_tail(tmp_path, lines=3)  # type: ignore[misc]
    assert path.name == "launch.log" and text == "line 47\nline 48\nline 49"
    # an lr CLI's error line above torchrun's traceback is the cause: it comes first
    (tmp_path / "logs" / "launch.log").write_text(
        "W torchrun warning\n[rank0]: lr-engine: error: --output_dir: run1 already holds files\n" + "".join(f"tb {i}\n" for i in range(30))
    )
    _, text = log_tail(tmp_path, lines=2)  # type: ignore[misc]
    assert text == "[rank0]: lr-engine: error: --output_dir: run1 already holds files\n...\ntb 28\ntb 29"


def test_safetensors_header_gives_count_bytes_and_dtypes(tmp_path):
    path = tmp_path / "w.safetensors"
    write_weights(path, {"a": ("float32", (3, 4)), "b": ("float16", (8,)), "c": ("float32", (2,))})
    summary = summarize_tensors(path)
    assert (summary.count, summary.nbytes, summary.dtypes) == (3, 48 + 16 + 8, {"F32": 2, "F16": 1})
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", 10**9) + b"{}")
    with pytest.raises(CheckpointError, match=r"bad.safetensors: truncated or corrupt safetensors file \(header of 1000000000 bytes in a 10-byte file\)"):
        summarize_tensors(bad)
    cut = tmp_path / "cut.safetensors"  # a header that promises more tensor data than the file holds
    cut.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(CheckpointError, match="cut.safetensors: truncated or padded file: the header promises 72 bytes of tensor data, the file holds 68"):
        summarize_tensors(cut)


def test_scan_lists_step_dirs_with_contract_fields_and_the_last_link(tmp_path):
    make_checkpoint(tmp_path, 100, checkpoint_format="safetensors_dcp", fake_dcp=True)
    make_checkpoint(tmp_path, 200, checkpoint_format="dcp", weights=None, fake_dcp=True, precision="no")
    make_checkpoint(tmp_path, 300, weights="adapter")
    (tmp_path / "checkpoints" / ".tmp-000400-abc" / "pretrained_model").mkdir(parents=True)
    point_last(tmp_path, 200)
    rows = scan_checkpoints(tmp_path)
    assert [(r.name, r.format, r.weights, r.dcp, r.is_last, r.precision) for r in rows] == [
        ("000100", "safetensors_dcp", "model", True, False, "bf16"),
        ("000200", "dcp", "", True, True, "no"),
        ("000300", "safetensors", "adapter", False, False, "bf16"),
    ]
    assert rows[0].topology == "fsdp2 1x2"
    assert rows[0].size == sum(size for _, size in checkpoint_details(rows[0].path).files)


def test_details_read_tensors_from_headers(tmp_path):
    step_dir = make_checkpoint(tmp_path, 100)
    details = checkpoint_details(step_dir)
    summary = details.tensors["pretrained_model/model.safetensors"]
    assert (summary.count, summary.nbytes) == (4, (32 * 16 + 32 + 4 * 32 + 4) * 4)
    assert details.training_step is not None and details.training_step.step == 100
    assert [rel for rel, _ in details.files] == [
        "pretrained_model/model.safetensors",
        "pretrained_model/train_config.json",
        "training_state/training_step.json",
    ]


def test_downsample_means_spans_and_never_exceeds_the_width():
    assert downsample([1, 2, 3], 10) == [1, 2, 3]
    assert downsample([1, 3, 5, 7], 2) == [2, 6]
    assert len(downsample(list(range(1000)), 37)) == 37
    assert downsample([], 5) == [] and downsample([1.0], 0) == []


def test_formats():
    assert format_bytes(512) == "512 B" and format_bytes(2048) == "2.0 KB" and format_bytes(3 * 1024**3) == "3.0 GB"
    assert format_duration(42) == "42s" and format_duration(187) == "3m07s" and format_duration(3725) == "1h02m"


def test_cli_argv_are_lists_for_this_interpreter(tmp_path):
    assert cli_tasks.convert_argv(tmp_path, "bf16") == [
        sys.executable, "-m", "lr_checkpoint.cli", "convert", str(tmp_path), "--dtype=bf16"  # the folder is positional
    ]
    assert cli_tasks.convert_argv(tmp_path, "fp32", overwrite=True)[-1] == "--overwrite=true"
    assert cli_tasks.verify_argv(tmp_path) == [sys.executable, "-m", "lr_checkpoint.cli", "verify", str(tmp_path)]
    assert cli_tasks.publish_argv(tmp_path, "me/x") == [
        sys.executable, "-m", "lr_publish.cli", f"--checkpoint_dir={tmp_path}", "--repo_id=me/x"
    ]
    assert cli_tasks.plan_argv(["--dry_run=true", "--world_size=2"]) == [
        sys.executable, "-m", "lr_engine.cli", "train", "--dry_run=true", "--world_size=2"
    ]


# Each line is one os.write: both processes append to the same log at once, and print()
# under PYTHONUNBUFFERED (which the launch sets) writes a line's text and its newline apart.
GROUP_OF_TWO = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
def note(sig, frame):
    os.write(1, f"launcher got {signal.Signals(sig).name}\\n".encode())
signal.signal(signal.SIGINT, note)
os.write(1, b"started\\n")
time.sleep(60)
"""
CHILD = """
import os, signal, sys, time
signal.signal(signal.SIGINT, lambda s, f: os.write(1, b"child got SIGINT\\n"))
os.write(1, b"child ready\\n")
time.sleep(60)
"""


def test_start_training_runs_detached_records_the_launch_and_stop_signals_its_whole_group(tmp_path):
    import os
    import signal
    import time

    from lr_tui._run_control import liveness, read_launch_record, send_stop

    log = tmp_path / "logs" / "launch.log"
    proc = cli_tasks.start_training([sys.executable, "-c", GROUP_OF_TWO, CHILD], tmp_path)
    try:
        assert os.getsid(proc.pid) == proc.pid  # its own session: a closed terminal or app does not kill it
        record = read_launch_record(tmp_path)
        assert record is not None and record.pid == proc.pid and record.argv[-1] == CHILD
        deadline = time.monotonic() + 30
        while "child ready" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        live = liveness(record, None)
        assert live.alive and live.describe() == f"2 alive (launcher {proc.pid} + 1)"

        assert send_stop(live, 0) == f"SIGINT to the launch's process group {proc.pid}"
        got = {"launcher got SIGINT", "child got SIGINT"}
        while not got <= set(log.read_text().splitlines()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert got <= set(log.read_text().splitlines())
        assert proc.poll() is None  # SIGINT asks; it does not kill

        assert send_stop(live, 1) == f"SIGTERM to the launch's process group {proc.pid}"
        assert proc.wait(timeout=20) == -signal.SIGTERM
        assert not liveness(record, None).alive and liveness(record, None).describe() == "none alive"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_the_command_line_refuses_a_file_as_a_run_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`lr-tui FILE` exits 2 with a message (it showed a NotADirectoryError traceback inside
    the app and exited 0); a folder that does not exist yet stays allowed (the run may start later)."""
    from lr_tui._app import main

    a_file = tmp_path / "run.json"
    a_file.write_text("{}")
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "not-yet"), str(a_file)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"lr-tui: error: {a_file} is a file, not a run folder" in err and "Traceback" not in err
