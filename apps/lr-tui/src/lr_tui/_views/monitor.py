"""The Monitor view: the runs found and those launched or opened in this app, one of them live, and control over them.

The runs table lists, newest first, the runs found under the run roots (`outputs/train`, where
lr-engine puts a run started without --output_dir, and each `lr-tui --runs=DIR`), and every run
launched from this TUI or output dir opened (`o`, with folder-name completion), once each (a
folder opened again by another path, relative or absolute or through a link, is the same row,
named as it was first): status (`stale`: run.json says running but its pid is gone on this
host), step, policy type, layout, last loss (`_run_list.RunFinder`, in a thread worker every
`list_interval` seconds, re-reading only files whose mtime changed) and, for the runs launched or
opened in this app, their state as the watcher polls it (`run_state.read_run_state`: also "launch exited
with code N", and the live processes on the status line: the launcher recorded in
`logs/launch.json` and the processes below it, else run.json's pid; /proc). Enter on a row
watches that run; the Checkpoints view opens on the highlighted one (`selected_run`).

A thread worker polls every `poll_interval` seconds: the watched run's `metrics.jsonl`
(`MetricsTail`) and combined log (`LogWatch`: new lines and their events), and the state
of every run launched or opened in this app. The UI thread redraws the charts, the latest values, the status
line, the events (with what to do about each) and, for a failed run, the tail of its log; the
new log lines go to the Logs view through `MonitorView.LogUpdate`.

The charts (`MetricChart`, textual-plotext line charts in a `ChartStack`) plot loss, the
--eval_freq success rate (only once a charted run has an evaluation), lr, grad_norm and
samples_per_s against the step: the watched run's line, then one per run marked for comparison
(`c` on a row of the list, `●` before its name, 4 at most; `c` again unmarks it), each its own
colour, named in the legend above the charts. The list's worker reads the marked runs'
metrics.jsonl (`MetricsTails`, from the start at each marking) with the list, at once when one
is marked. `y` switches the loss between a log (at first) and a linear y axis, `z` zooms all of
them to the last 1000 steps, the last 100, and back to all; the titles say which, and how many
points could not be drawn (NaN, inf, <= 0 on a log scale).

Stop (x) asks first, then sends SIGINT (lr-engine stops at the next update, or the one
after, and saves a final checkpoint) and SIGTERM after `stop_grace` seconds if anything
still runs; x again sends the next signal at once (SIGTERM, then SIGKILL). Resume (r) opens
the resume screen for `checkpoints/last` (the Checkpoints view's r, through `resume`, for the
checkpoint selected there) and launches the command it builds, detached, into the same
folder, unless a run has started there while the screen was open.
"""

from __future__ import annotations

import itertools
import subprocess
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import DataTable, Static
from textual.worker import get_current_worker

from lr_config import ConfigError, LaunchSpec, MetricsRecord
from lr_config.layout import METRICS

from .._chart_data import RunColumns, Series
from .._checkpoint_scan import read_training_step
from .._cli_tasks import start_training
from .._events import Event
from .._keymap import MONITOR_BINDINGS
from .._metrics_tail import MetricsRead, MetricsTail, MetricsTails
from .._procs import all_processes
from .._resume_plan import last_checkpoint, output_dir_override
from .._run_control import STOP_STAGES, send_stop
from .._run_info import RunSummary, log_tail
from .._run_list import RunFinder, RunInfo, name_under
from .._run_state import LogRead, LogWatch, RunState, read_run_state, run_liveness
from .._screens.prompt import ChoicePrompt, DirectorySuggester, TextPrompt
from .._screens.resume import ResumeScreen
from .._series import format_value
from .._widgets.events_panel import EventsPanel
from .._widgets.metric_chart import ChartStack, MetricChart, legend
from .._widgets.table import Table
from .._widgets.text_panel import TextPanel

__all__ = ["MonitorView"]

CHARTS = ("loss", "lr", "grad_norm", "samples_per_s")
LOG_CHARTS = ("loss",)
"""The charts whose y axis `y` toggles between log (at first) and linear."""
EVAL_CHART = "eval"
"""The chart of the --eval_freq success rates (under the loss), shown when a charted run has one."""
ZOOMS: tuple[int | None, ...] = (None, 1000, 100)
"""What `z` steps through: every step, then the last 1000, the last 100."""
MAX_COMPARED = 4


def eval_rows(records: list[MetricsRecord]) -> list[tuple[str, str]]:
    """The latest --eval_freq evaluation of the run (none: no row): its success rate with the
    95% interval, the step, the episodes, and the first one's for comparison."""
    evaluated = [r for r in records if r.eval is not None]
    if not evaluated:
        return []
    last, first = evaluated[-1], evaluated[0]
    assert last.eval is not None and first.eval is not None
    e = last.eval
    rows = [("eval success", f"{100 * e.success_rate:.1f}% ({100 * e.success_ci95_low:.0f}-{100 * e.success_ci95_high:.0f}%) "
                             f"at step {last.step}, {e.n_episodes} ep")]
    if first is not last:
        rows.append(("first eval", f"{100 * first.eval.success_rate:.1f}% at step {first.step}"))
    rows.append(("eval reward", format_value(e.avg_sum_reward)))
    return rows
TABLE_FIELDS = ("step", "epoch", "samples", "loss", "lr", "grad_norm", "samples_per_s", "update_s", "dataloading_s", "mem_gb")
QUIET_STATES = ("running", "finished", "stopped", "no run.json yet")
"""States whose log tail is not worth a panel (the events say what matters)."""
NO_RUN = "no run watched: enter watches the highlighted run, o opens a folder"
RUN_COLUMNS = ("run", "status", "step", "policy", "layout", "loss")
"""80 columns wide; the watched run's processes are on the status line."""
COMPARE_MARK = "● "
"""Before the name of a run marked for comparison."""

LaunchSpecSource = Callable[[], LaunchSpec | None]


def run_labels(paths: Sequence[Path], listed: dict[Path, str]) -> list[str]:
    """The charts' legend: each run's folder name, or where two share one, their names in the
    run list (else their paths)."""
    short = [path.name or str(path) for path in paths]
    return [name if short.count(name) == 1 else listed.get(path, str(path)) for name, path in zip(short, paths)]


@dataclass
class RunUpdate:
    """What one poll found; `records` and `log.lines` are new since the last poll."""

    records: list[MetricsRecord] = field(default_factory=list)
    restarted: bool = False
    problems: list[str] = field(default_factory=list)
    states: dict[Path, RunState] = field(default_factory=dict)
    log: tuple[Path, str] | None = None
    log_read: LogRead | None = None


class MonitorView(Vertical):
    BINDINGS = MONITOR_BINDINGS

    class LogUpdate(Message):
        """New lines (and events) of the watched run's combined log."""

        def __init__(self, run_dir: Path, read: LogRead) -> None:
            super().__init__()
            self.run_dir = run_dir
            self.read = read

    class ShowLog(Message):
        """Show the watched run's log in the Logs view, at its first error."""

    class RunSelected(Message):
        """The Monitor now watches `run_dir`."""

        def __init__(self, run_dir: Path) -> None:
            super().__init__()
            self.run_dir = run_dir

    def __init__(
        self,
        *,
        poll_interval: float = 0.5,
        stop_grace: float = 30.0,
        launch_spec: LaunchSpecSource | None = None,
        run_roots: Sequence[Path] = (),
        list_interval: float = 2.0,
        id: str | None = None,
    ) -> None:
        super().__init__(id=id)
        self.poll_interval = poll_interval
        self.run_roots = tuple(Path(r) for r in run_roots)
        self.list_interval = list_interval
        self.found: list[RunInfo] = []
        """The last read of the run list (`RunFinder.read`), newest first."""
        self.list_reads = 0
        self._list_wake = threading.Event()
        self.stop_grace = stop_grace
        self.launch_spec = launch_spec or LaunchSpec
        self.run_dir: Path | None = None
        self.run_dirs: tuple[Path, ...] = ()
        self.launched: dict[Path, subprocess.Popen[bytes]] = {}
        self.states: dict[Path, RunState] = {}
        self.stop_stage: dict[Path, int] = {}
        self.records: list[MetricsRecord] = []
        self.problems: list[str] = []
        self.events: list[Event] = []
        self.summary: RunSummary | None = None
        self.polls = 0
        self._latest_rows: list[tuple[str, str]] = []  # what the "latest" table shows
        self.compared: tuple[tuple[Path, int], ...] = ()
        """The runs marked for comparison (`c`), in order, each with the number of its marking:
        the list worker reads each marking's metrics from the start."""
        self.columns = RunColumns(CHARTS)
        """The watched run's metrics, for the charts."""
        self.compared_columns: dict[Path, RunColumns] = {}
        self._markings = itertools.count()
        self.log_scale = True
        """The loss chart's y axis (`y`)."""
        self.zoom = 0
        """Which of `ZOOMS` the charts show (`z`)."""

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The launcher this app started for the watched run, if any."""
        return self.launched.get(self.run_dir) if self.run_dir is not None else None

    def compose(self) -> ComposeResult:
        runs: DataTable[str] = Table(id="runs", cursor_type="row")
        runs.border_title = "runs (enter: watch)"
        yield runs
        yield Static(NO_RUN, id="run-status", markup=False)
        with Horizontal(id="monitor-body"):
            with Vertical(id="charts-box"):
                yield Static(id="chart-legend")
                with ChartStack(id="charts"):
                    charts = [MetricChart(metric, log_toggle=metric in LOG_CHARTS) for metric in CHARTS]
                    charts.insert(1, MetricChart(EVAL_CHART, name="eval success", percent=True))  # under the loss
                    yield from charts
            table: DataTable[str] = Table(id="latest", cursor_type="none", zebra_stripes=True)
            table.border_title = "latest"
            yield table
        yield EventsPanel(id="events")
        yield TextPanel("log", id="failure-log")

    def on_mount(self) -> None:
        self.query_one("#latest", DataTable).add_columns("metric", "value")
        self.query_one("#runs", DataTable).add_columns(*RUN_COLUMNS)
        self.query_one("#events", EventsPanel).show([])
        self._fill_runs()
        self._draw_charts()
        if self.run_dir is not None:
            self.open_run(self.run_dir, self.process)
        self._list_runs()

    # --- which run ---------------------------------------------------------------------------

    def open_run(self, run_dir: Path, process: subprocess.Popen[bytes] | None = None) -> None:
        """List `run_dir` (with the launched `process`, if the app started it) and watch it."""
        run_dir = self.known_path(run_dir)
        if process is not None:
            self.launched[run_dir] = process
            self.stop_stage.pop(run_dir, None)
        if run_dir not in self.run_dirs:
            self.run_dirs = (*self.run_dirs, run_dir)
        self.run_dir = run_dir
        if not self.is_mounted:  # on_mount opens it
            return
        self._add_run_row(run_dir)
        self.records, self.problems, self.events, self.summary, self.polls = [], [], [], None, 0
        self.columns = RunColumns(CHARTS)
        self._redraw()
        self.query_one("#events", EventsPanel).show([])
        self.post_message(self.RunSelected(run_dir))
        self._watch(run_dir)

    def known_path(self, run_dir: Path) -> Path:
        """`run_dir` as the Monitor lists it: the path it was first opened by, when the folder is
        listed already (by a relative or absolute path, or through a link), else as given."""
        run_dir = Path(run_dir)
        target = run_dir.resolve()
        return next((known for known in self.run_dirs if known == run_dir or known.resolve() == target), run_dir)

    def _add_run_row(self, run_dir: Path) -> None:
        table = self.query_one("#runs", DataTable)
        self._fill_runs()
        table.move_cursor(row=table.get_row_index(str(run_dir)))
        self._list_wake.set()  # its run.json, train_config.json and loss soon

    @property
    def selected_run(self) -> Path | None:
        """The run of the highlighted row of the run list, else the watched run."""
        table = self.query_one("#runs", DataTable) if self.is_mounted else None
        if table is not None and table.row_count and table.is_valid_row_index(table.cursor_row):
            key = table.ordered_rows[table.cursor_row].key.value
            if key is not None:
                return Path(key)
        return self.run_dir

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "runs" and event.row_key.value is not None:
            run_dir = Path(event.row_key.value)
            if run_dir != self.run_dir:
                self.open_run(run_dir)

    # --- polling -----------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="runs")
    def _list_runs(self) -> None:
        """Every `list_interval` seconds (or at once when a run is opened or marked): the run
        list, and the new metrics of the runs marked for comparison."""
        worker = get_current_worker()
        finder = RunFinder(self.run_roots)
        tails = MetricsTails()
        last: list[RunInfo] | None = None
        while not worker.is_cancelled:
            self._list_wake.clear()
            found = finder.read(self.run_dirs)
            reads = tails.read([(marking, marking[0]) for marking in self.compared])
            if found != last or reads:
                last = found
                try:
                    self.app.call_from_thread(self._apply_list, found, reads)
                except RuntimeError:  # the app is shutting down
                    return
            self._list_wake.wait(self.list_interval)

    def _apply_list(self, found: list[RunInfo], reads: dict[Hashable, MetricsRead] | None = None) -> None:
        if not self.query("#runs"):  # the app is closing
            return
        self.found = found
        self.list_reads += 1
        self._fill_runs()
        reads = reads or {}
        for marking in self.compared:  # a marking gone is a run unmarked since
            read = reads.get(marking)
            if read is not None:
                path = marking[0]
                if read.restarted or path not in self.compared_columns:
                    self.compared_columns[path] = RunColumns(CHARTS)
                self.compared_columns[path].extend(read.records)
        if reads:
            self._draw_charts()

    @work(thread=True, exclusive=True, group="tail")
    def _watch(self, run_dir: Path) -> None:
        worker = get_current_worker()
        tail = MetricsTail(run_dir / METRICS)
        log = LogWatch(run_dir)
        wake = threading.Event()
        last: tuple[dict[Path, RunState], tuple[Path, str] | None] = ({}, None)
        while not worker.is_cancelled:
            update = self._poll(run_dir, tail, log, last)
            if update is not None:
                last = (update.states, update.log)
            try:
                self.app.call_from_thread(self._apply, run_dir, update)
            except RuntimeError:  # the app is shutting down
                return
            wake.wait(self.poll_interval)

    def _poll(self, run_dir: Path, tail: MetricsTail, log: LogWatch, last: tuple[dict[Path, RunState], tuple[Path, str] | None]) -> RunUpdate | None:
        read = tail.read()
        log_read = log.read()
        procs = all_processes()
        states = {d: read_run_state(d, self.launched.get(d), procs) for d in self.run_dirs}
        state = states.get(run_dir)
        failure = log_tail(run_dir) if state is not None and state.summary.state not in QUIET_STATES else None
        news = log_read.lines or log_read.restarted or log_read.events is not None
        if not (read.records or read.restarted or read.problems or news or (states, failure) != last):
            return None
        return RunUpdate(read.records, read.restarted, read.problems, states, failure, log_read if news else None)

    def _apply(self, run_dir: Path, update: RunUpdate | None) -> None:
        if run_dir != self.run_dir or not self.query("#runs"):  # another run now, or the app is closing
            return
        self.polls += 1
        if update is None:
            return
        if update.restarted:
            self.records = []
            self.problems = []
            self.columns = RunColumns(CHARTS)
        self.records.extend(update.records)
        self.columns.extend(update.records)
        self.problems = (self.problems + update.problems)[-5:]
        self.states = update.states
        for path, state in update.states.items():
            if not state.live.alive:
                self.stop_stage.pop(path, None)
        if run_dir in update.states:
            self.summary = update.states[run_dir].summary
        if update.log_read is not None:
            if update.log_read.events is not None:
                self.events = update.log_read.events
                self.query_one("#events", EventsPanel).show(self.events)
            self.post_message(self.LogUpdate(run_dir, update.log_read))
        self._fill_runs()
        self._redraw(update.log)

    # --- drawing -----------------------------------------------------------------------------

    def _run_rows(self) -> dict[str, tuple[str, ...]]:
        """The run list's rows in order (key: the path): the runs launched or opened in this app
        not read yet first, then every run found, newest first; the app's own runs with their live state."""
        found = {info.path: info for info in self.found}
        rows: dict[str, tuple[str, ...]] = {}
        for path in [*(p for p in reversed(self.run_dirs) if p not in found), *found]:
            info = found.get(path) or RunInfo(path, name_under(path, self.run_roots))
            state = self.states.get(path)
            status, step = (state.status_cell, state.step_cell) if state is not None else (info.status, info.step_cell)
            name = f"{COMPARE_MARK}{info.name}" if path in self.compared_runs else info.name
            rows[str(path)] = (name, status, step, info.policy, info.layout, info.loss)
        return rows

    def _fill_runs(self) -> None:
        """Update the cells that changed; rebuild the table when the runs or their order did
        (keeping the highlighted run highlighted)."""
        table = self.query_one("#runs", DataTable)
        rows = self._run_rows()
        if [str(k.value) for k in table.rows] == list(rows):
            columns = list(table.columns)
            for key, cells in rows.items():
                for column, value in zip(columns, cells):
                    if table.get_cell(key, column) != value:
                        table.update_cell(key, column, value, update_width=True)
            return
        selected = self.selected_run
        table.clear()
        for key, cells in rows.items():
            table.add_row(*cells, key=key)
        if selected is not None and str(selected) in rows:
            table.move_cursor(row=table.get_row_index(str(selected)), animate=False)

    def _redraw(self, log: tuple[Path, str] | None = None) -> None:
        self._draw_charts()
        self._fill_table()
        self.query_one("#run-status", Static).update(self._status_line())
        self._show_failure(log)

    def charted_runs(self) -> list[tuple[Path, RunColumns]]:
        """The runs the charts draw, in the order of their colours: the watched run, then the
        marked ones (the watched run once, if it is marked too)."""
        runs = [(self.run_dir, self.columns)] if self.run_dir is not None else []
        runs += [(path, self.compared_columns.get(path) or RunColumns(CHARTS)) for path in self.compared_runs if path != self.run_dir]
        return runs

    def _draw_charts(self) -> None:
        runs = self.charted_runs()
        names = run_labels([path for path, _ in runs], self._list_names())
        last_steps = ZOOMS[self.zoom]
        for metric in CHARTS:
            series = [columns.series(name, metric) for name, (_, columns) in zip(names, runs)]
            latest = format_value(getattr(self.records[-1], metric)) if self.run_dir is not None and self.records else ""
            log_scale = self.log_scale and metric in LOG_CHARTS
            self.query_one(f"#chart-{metric}", MetricChart).show(series, log_scale=log_scale, last_steps=last_steps, latest=latest)
        self._draw_eval_chart([columns.eval_series(name) for name, (_, columns) in zip(names, runs)], last_steps)
        legend_box = self.query_one("#chart-legend", Static)
        legend_box.display = bool(self.compared)
        legend_box.update(legend(names))

    def _draw_eval_chart(self, series: list[Series], last_steps: int | None) -> None:
        chart = self.query_one(f"#chart-{EVAL_CHART}", MetricChart)
        shown = any(s.steps for s in series)
        if chart.display != shown:
            chart.display = shown
            self.query_one("#charts", ChartStack).fit()
        watched = series[0].values if series and self.run_dir is not None else []
        chart.show(series, last_steps=last_steps, latest=f"{100 * watched[-1]:.1f}%" if watched else "")

    def _list_names(self) -> dict[Path, str]:
        return {info.path: info.name for info in self.found}

    def _status_line(self) -> str:
        if self.run_dir is None:
            return NO_RUN
        parts = [self.summary.line()] if self.summary else []
        state = self.states.get(self.run_dir)
        if state is not None:
            parts.append(f"processes: {state.live.describe()}")
        stage = self.stop_stage.get(self.run_dir)
        if stage is not None:
            sent = STOP_STAGES[min(stage, len(STOP_STAGES) - 1)].name
            parts.append(f"stopping: {sent} sent" + (f", SIGTERM after {self.stop_grace:g} s (x: now)" if stage == 0 else ""))
        status = "   ".join(parts)
        if self.problems:
            status += f"   ({len(self.problems)} unreadable metrics line(s): {self.problems[-1]})"
        return status

    def _fill_table(self) -> None:
        """The latest record's values; the table is rebuilt only when they changed (a poll that
        found only a new process state keeps it, so its columns do not shrink to their headers
        until the next idle)."""
        rows: list[tuple[str, str]] = []
        if self.records:
            last = self.records[-1]
            rows = [(name, format_value(getattr(last, name))) for name in TABLE_FIELDS]
            rows += [(name, format_value(value)) for name, value in sorted(last.info.items())]
            rows += eval_rows(self.records)
        if rows == self._latest_rows:
            return
        self._latest_rows = rows
        table = self.query_one("#latest", DataTable)
        table.clear()
        for row in rows:
            table.add_row(*row)

    def _show_failure(self, log: tuple[Path, str] | None) -> None:
        panel = self.query_one("#failure-log", TextPanel)
        failed = self.summary is not None and self.summary.state not in QUIET_STATES and (log is not None or bool(self.summary.error))
        panel.display = failed
        if not failed or self.summary is None:
            return
        text = f"error: {self.summary.error}\n" if self.summary.error else ""
        if log is not None and self.run_dir is not None:
            path, tail = log
            panel.border_title = f"log: {path.relative_to(self.run_dir)} (last lines)"
            text += tail
        panel.show(text, error=True, follow=True)

    # --- actions -----------------------------------------------------------------------------

    def action_open_run(self) -> None:
        def check(path: str) -> str | None:
            return None if Path(path).is_dir() else f"{path}: not a folder"

        def open_it(path: str | None) -> None:
            if path:
                self.open_run(Path(path))

        prompt = TextPrompt("Open a run folder (tab completes)", str(self.run_dir or ""), check=check, suggester=DirectorySuggester())
        self.app.push_screen(prompt, open_it)

    def action_stop_run(self) -> None:
        run_dir = self.run_dir
        if run_dir is None:
            self.notify("No run open.", severity="warning")
            return
        if not run_liveness(run_dir).alive:
            self.notify(f"No process of {run_dir} is alive.", severity="warning")
            return
        stage = self.stop_stage.get(run_dir)
        if stage is not None:
            self._send_stop(run_dir, stage + 1)
            return

        def confirmed(choice: str | None) -> None:
            if choice == "stop":
                self._send_stop(run_dir, 0)

        choices = [
            ("stop", f"SIGINT now: stop at the next update (or the one after) with a final checkpoint; SIGTERM after {self.stop_grace:g} s"),
            ("cancel", "keep it running"),
        ]
        self.app.push_screen(ChoicePrompt(f"Stop {run_dir}?", choices), confirmed)

    def _send_stop(self, run_dir: Path, stage: int) -> None:
        live = run_liveness(run_dir)
        what = send_stop(live, stage) if live.alive else ""
        if not what:
            self.notify(f"No process of {run_dir} is alive any more.")
            self.stop_stage.pop(run_dir, None)
            return
        self.stop_stage[run_dir] = stage
        self.notify(f"Sent {what}.", severity="warning" if stage else "information")
        if stage == 0:
            self.set_timer(self.stop_grace, partial(self._escalate, run_dir, 0, time.monotonic()))
        self.query_one("#run-status", Static).update(self._status_line())

    def _escalate(self, run_dir: Path, stage: int, since: float) -> None:
        """After the grace: the next signal, unless the run ended or was escalated by hand."""
        if self.stop_stage.get(run_dir) == stage and run_liveness(run_dir).alive:
            self.notify(f"{run_dir} still runs {time.monotonic() - since:.0f} s after SIGINT.", severity="warning")
            self._send_stop(run_dir, stage + 1)

    def action_resume_run(self) -> None:
        run_dir = self.run_dir
        if run_dir is None:
            self.notify("No run open.", severity="warning")
            return
        step_dir = last_checkpoint(run_dir)
        if step_dir is None:
            self.notify(f"{run_dir}/checkpoints/last: nothing to resume from.", severity="warning")
            return
        self.resume(run_dir, step_dir)

    def resume(self, run_dir: Path, step_dir: Path, launched: Callable[[], None] | None = None) -> None:
        """Open the resume screen for checkpoint `step_dir` of `run_dir` (processes preset to the
        saved world size, the Launch form's launcher), and launch what it returns into `run_dir`;
        then call `launched`."""
        run_dir = self.known_path(run_dir)
        if run_liveness(run_dir).alive:
            self.notify("The run is still running: stop it first (Monitor: x).", severity="warning")
            return
        spec = self.launch_spec() or LaunchSpec()
        ts, _ = read_training_step(step_dir)
        if ts is not None and ts.topology.world_size % spec.nnodes == 0:
            spec = replace(spec, nproc_per_node=ts.topology.world_size // spec.nnodes)
        try:
            fixed = output_dir_override(step_dir, run_dir)
        except ConfigError as exc:
            self.notify(str(exc), severity="error", timeout=10)
            return
        last = last_checkpoint(run_dir)
        is_last = last is not None and last == step_dir.resolve()

        def launch(argv: list[str] | None) -> None:
            if argv and self._launch_resume(run_dir, argv) and launched is not None:
                launched()

        self.app.push_screen(ResumeScreen(run_dir, step_dir, spec, fixed, is_last=is_last), launch)

    def _launch_resume(self, run_dir: Path, argv: list[str]) -> bool:
        if run_liveness(run_dir).alive:  # started while the resume screen was open
            self.notify(f"Not resumed: a run is still running in {run_dir}. Stop it first (x).", severity="error", timeout=10)
            return False
        try:
            process = start_training(argv, run_dir, stop_grace=self.stop_grace)
        except OSError as exc:
            self.notify(f"Could not start {argv[0]}: {exc}", severity="error")
            return False
        self.notify(f"Resumed {run_dir} (pid {process.pid}); log in {run_dir}/logs/launch.log")
        self.open_run(run_dir, process)
        return True

    def action_show_log(self) -> None:
        self.post_message(self.ShowLog())

    @property
    def compared_runs(self) -> list[Path]:
        """The runs marked for comparison, in the order they were marked."""
        return [path for path, _ in self.compared]

    def action_compare(self) -> None:
        """Mark the highlighted run for comparison, or unmark it."""
        path = self.selected_run
        if path is None:
            self.notify("No run to compare: the run list is empty.", severity="warning")
            return
        if path in self.compared_runs:
            self.compared = tuple(m for m in self.compared if m[0] != path)
            self.compared_columns.pop(path, None)
        elif len(self.compared) >= MAX_COMPARED:
            self.notify(f"Compare {MAX_COMPARED} runs at most: unmark one first (c on its row).", severity="warning")
            return
        else:
            self.compared = (*self.compared, (path, next(self._markings)))
            self._list_wake.set()  # its metrics now
        self._fill_runs()
        self._draw_charts()

    def action_zoom(self) -> None:
        self.zoom = (self.zoom + 1) % len(ZOOMS)
        self._draw_charts()

    def action_log_scale(self) -> None:
        self.log_scale = not self.log_scale
        self._draw_charts()

    def focus_main(self) -> None:
        self.query_one("#runs").focus()
