"""The Monitor view: one run folder, live.

A thread worker polls the run every `poll_interval` seconds: it tails `metrics.jsonl`
(`MetricsTail`: byte offset kept, partial last line kept, start over when the file
shrinks), reads `run.json`, and for a failed run the tail of its newest `logs/*.log`.
It hands what changed to the UI thread, which redraws the sparklines (loss, lr,
grad_norm, samples_per_s, downsampled to their width), the table of latest values and
the status line.
"""

from __future__ import annotations

import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Static
from textual.worker import get_current_worker

from lr_config import MetricsRecord

from ..cli_tasks import stop_training
from ..keymap import MONITOR_BINDINGS
from ..metrics_tail import MetricsTail
from ..run_info import RunSummary, log_tail, summarize_run
from ..screens.prompt import TextPrompt
from ..series import format_value
from ..widgets.metric_chart import MetricChart
from ..widgets.text_panel import TextPanel

__all__ = ["MonitorView"]

CHARTS = ("loss", "lr", "grad_norm", "samples_per_s")
TABLE_FIELDS = ("step", "epoch", "samples", "loss", "lr", "grad_norm", "samples_per_s", "update_s", "dataloading_s", "mem_gb")


@dataclass
class RunUpdate:
    """What one poll found; `records` are new since the last poll."""

    records: list[MetricsRecord] = field(default_factory=list)
    restarted: bool = False
    problems: list[str] = field(default_factory=list)
    summary: RunSummary | None = None
    log: tuple[Path, str] | None = None


class MonitorView(Vertical):
    BINDINGS = MONITOR_BINDINGS

    def __init__(self, *, poll_interval: float = 0.5, id: str | None = None) -> None:
        super().__init__(id=id)
        self.poll_interval = poll_interval
        self.run_dir: Path | None = None
        self.records: list[MetricsRecord] = []
        self.problems: list[str] = []
        self.summary: RunSummary | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.polls = 0

    def compose(self) -> ComposeResult:
        yield Static("no run open: press o to open a run folder, or launch one", id="run-title", markup=False)
        yield Static("", id="run-status", markup=False)
        with Horizontal(id="monitor-body"):
            with Vertical(id="charts"):
                for metric in CHARTS:
                    yield MetricChart(metric)
            table: DataTable[str] = DataTable(id="latest", cursor_type="none", zebra_stripes=True)
            table.border_title = "latest"
            yield table
        yield TextPanel("log", id="failure-log")

    def on_mount(self) -> None:
        table = self.query_one("#latest", DataTable)
        table.add_columns("metric", "value")
        if self.run_dir is not None:
            self.open_run(self.run_dir, self.process)

    def open_run(self, run_dir: Path, process: subprocess.Popen[bytes] | None = None) -> None:
        """Watch `run_dir` from now on (the launched `process`, if the app started it)."""
        self.run_dir = Path(run_dir)
        self.process = process
        if not self.is_mounted:  # on_mount opens it
            return
        self.records = []
        self.problems = []
        self.summary = None
        self.polls = 0
        self.query_one("#run-title", Static).update(f"run: {self.run_dir}")
        self._redraw()
        self._watch(self.run_dir)

    @work(thread=True, exclusive=True, group="tail")
    def _watch(self, run_dir: Path) -> None:
        worker = get_current_worker()
        tail = MetricsTail(run_dir / "metrics.jsonl")
        wake = threading.Event()
        last: tuple[RunSummary | None, tuple[Path, str] | None] = (None, None)
        while not worker.is_cancelled:
            read = tail.read()
            summary = self._summary(run_dir)
            log = log_tail(run_dir) if summary.state not in ("running", "finished", "no run.json yet") else None
            changed = read.records or read.restarted or read.problems or (summary, log) != last
            last = (summary, log)
            update = RunUpdate(read.records, read.restarted, read.problems, summary, log) if changed else None
            try:
                self.app.call_from_thread(self._apply, run_dir, update)
            except RuntimeError:  # the app is shutting down
                return
            wake.wait(self.poll_interval)

    def _summary(self, run_dir: Path) -> RunSummary:
        """run.json's word, unless the process this app launched died before writing it."""
        summary = summarize_run(run_dir)
        code = self.process.poll() if self.process is not None else None
        if code is not None and summary.state in ("no run.json yet", "running"):
            return RunSummary(state=f"launch exited with code {code}", step=summary.step, steps=summary.steps)
        return summary

    def _apply(self, run_dir: Path, update: RunUpdate | None) -> None:
        if run_dir != self.run_dir:
            return
        self.polls += 1
        if update is None:
            return
        if update.restarted:
            self.records = []
            self.problems = []
        self.records.extend(update.records)
        self.problems = (self.problems + update.problems)[-5:]
        self.summary = update.summary
        self._redraw(update.log)

    def _redraw(self, log: tuple[Path, str] | None = None) -> None:
        for metric in CHARTS:
            self.query_one(f"#chart-{metric}", MetricChart).set_values([getattr(r, metric) for r in self.records])
        self._fill_table()
        status = self.summary.line() if self.summary else ""
        if self.problems:
            status += f"   ({len(self.problems)} unreadable metrics line(s): {self.problems[-1]})"
        self.query_one("#run-status", Static).update(status)
        self._show_failure(log)

    def _fill_table(self) -> None:
        table = self.query_one("#latest", DataTable)
        table.clear()
        if not self.records:
            return
        last = self.records[-1]
        for name in TABLE_FIELDS:
            table.add_row(name, format_value(getattr(last, name)))
        for name, value in sorted(last.info.items()):
            table.add_row(name, format_value(value))

    def _show_failure(self, log: tuple[Path, str] | None) -> None:
        panel = self.query_one("#failure-log", TextPanel)
        failed = self.summary is not None and self.summary.state != "running" and (log is not None or bool(self.summary.error))
        panel.display = failed
        if not failed or self.summary is None:
            return
        text = f"error: {self.summary.error}\n" if self.summary.error else ""
        if log is not None and self.run_dir is not None:
            path, tail = log
            panel.border_title = f"log: {path.relative_to(self.run_dir)} (last lines)"
            text += tail
        panel.show(text, error=True, follow=True)

    def action_open_run(self) -> None:
        def check(path: str) -> str | None:
            return None if Path(path).is_dir() else f"{path}: not a folder"

        def open_it(path: str | None) -> None:
            if path:
                self.open_run(Path(path))

        self.app.push_screen(TextPrompt("Open a run folder", str(self.run_dir or ""), check=check), open_it)

    def action_stop_run(self) -> None:
        if self.process is None or self.process.poll() is not None:
            self.notify("No run started from this app is running.", severity="warning")
            return
        stop_training(self.process)
        self.notify(f"Sent SIGTERM to the launch (pid {self.process.pid}).")

    def focus_main(self) -> None:
        self.query_one("#latest").focus()
