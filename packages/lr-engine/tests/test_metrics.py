"""The main rank's metrics sink: its background writes keep their order, and a write that
fails is raised at the next log step or at the end of the loop, not lost."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from lr_config import MetricsRecord, TrainConfig, read_metrics

from lr_engine._metrics import MetricsSink


def _sink(output_dir: Path) -> MetricsSink:
    return MetricsSink(TrainConfig(), output_dir, total_steps=30, start_step=0)


def test_lines_then_their_callbacks_are_written_in_order_off_the_calling_thread(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sink = _sink(tmp_path)
    seen: list[tuple[int, int, str]] = []

    def after(step: int) -> None:
        # run.json's update follows its own metrics line: the line is in the file already
        lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
        seen.append((step, json.loads(lines[-1])["step"], threading.current_thread().name))

    for step in (10, 20, 30):
        sink.write(MetricsRecord(step=step, loss=1.0 / step), then=lambda step=step: after(step))
    sink.close()
    assert [r.step for r in read_metrics(tmp_path / "metrics.jsonl")] == [10, 20, 30]
    assert [(a, b) for a, b, _ in seen] == [(10, 10), (20, 20), (30, 30)]
    assert all(name.startswith("lr-metrics-io") for _, _, name in seen)
    assert "step 30/30" in capsys.readouterr().out  # the console line is printed by the caller


def test_a_failed_write_is_raised_at_the_next_write_and_at_close(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").mkdir()  # appending to it fails
    sink = _sink(tmp_path)
    sink.write(MetricsRecord(step=10))
    with pytest.raises(IsADirectoryError):
        sink.write(MetricsRecord(step=20))  # raised before step 20 is handed over
    sink.close()  # nothing left in flight
    last = _sink(tmp_path)
    last.write(MetricsRecord(step=30))
    with pytest.raises(IsADirectoryError):
        last.close()


def test_a_failed_write_does_not_replace_the_error_a_failing_run_ends_with(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "metrics.jsonl").mkdir()
    sink = _sink(tmp_path)
    sink.write(MetricsRecord(step=10))
    sink.close(failed=True)  # no raise: the run's own error is the one reported
    assert "warning: the last metrics write failed: IsADirectoryError" in capsys.readouterr().err


def test_keep_records_through_cuts_the_file_back_atomically(tmp_path: Path) -> None:
    """A resume into the run's folder from step 10 keeps the records up to 10: the later ones (and a
    line a crash cut short) go, in one rename, so that the steps trained again are not listed twice."""
    from lr_engine._metrics import keep_records_through

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (5, 10, 15, 20)) + '{"step": 25, "lo')
    assert keep_records_through(path, 10) == 3
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [5, 10]
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]  # no temp file left
    before = path.stat().st_mtime_ns
    assert keep_records_through(path, 10) == 0 and path.stat().st_mtime_ns == before  # nothing to drop: not rewritten
    assert keep_records_through(tmp_path / "none.jsonl", 10) == 0
