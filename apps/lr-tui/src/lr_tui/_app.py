"""`lr-tui [--runs=DIR ...] [OUTPUT_DIR ...]`: build launches, watch and control runs, browse checkpoints.

Five views in tabs (keys 1-5): Launch, Monitor, Checkpoints, Logs, Hardware; `?` shows
every key and ctrl+p the command palette. The Monitor lists the runs under `outputs/train`
(lr-engine's default) and each `--runs=DIR`; opening with OUTPUT_DIRs lists them too (a
launch from an earlier session reattaches) and watches the first. The app never imports
torch: it reads files and /proc and runs lr's CLIs as subprocesses.
"""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from textual.app import App, ComposeResult, SystemCommand
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, TabbedContent, TabPane

from lr_config import VERSION_FLAG, versions_text

from ._hardware import HardwareSource, HostHardware
from ._keymap import APP_BINDINGS
from ._run_list import RUNS_ROOT
from ._screens.help import HelpScreen
from ._views.launch import LaunchView, PlanRunner, run_plan
from ._widgets.deferred import Deferred

if TYPE_CHECKING:
    from ._views.checkpoints import CheckpointsView
    from ._views.hardware import HardwareView
    from ._views.logs import LogView
    from ._views.monitor import MonitorView

    View = LaunchView | MonitorView | CheckpointsView | LogView | HardwareView

__all__ = ["LrApp", "main"]


class LrApp(App[None]):
    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "lr"
    BINDINGS = APP_BINDINGS
    AUTO_FOCUS = "#launch-form, #runs"
    """The main widget of the first view (only that view is mounted at first): one focus
    change at start, where each costs a restyle. Modal screens set their own."""

    def __init__(
        self,
        run_dir: Path | list[Path] | None = None,
        *,
        plan_runner: PlanRunner | None = run_plan,
        plan_delay: float = 0.5,
        poll_interval: float = 0.5,
        stop_grace: float = 30.0,
        hardware: HardwareSource | None = None,
        hardware_interval: float = 1.0,
        runs: Sequence[Path] | None = None,
        list_interval: float = 2.0,
    ) -> None:
        """`runs`: the folders whose runs the Monitor lists (None: `outputs/train`, lr-engine's
        default); `list_interval`: seconds between two reads of that list."""
        super().__init__()
        self.run_roots = list(runs) if runs is not None else None
        self.list_interval = list_interval
        self.run_dirs = [run_dir] if isinstance(run_dir, Path) else list(run_dir or [])
        self.run_dir = self.run_dirs[0] if self.run_dirs else None
        self.plan_runner = plan_runner
        self.plan_delay = plan_delay
        self.poll_interval = poll_interval
        self.stop_grace = stop_grace
        self.hardware = hardware or HostHardware()
        self.hardware_interval = hardware_interval
        self._views: dict[str, View] = {}

    # The views are built on first use (`_view`). The first view is built and mounted before
    # the first frame; the others (and their modules: ~60 ms of imports) only right after it,
    # when their `Deferred` placeholder mounts them, or earlier if code asks for them.

    def _build_view(self, name: str) -> View:
        if name == "launch":
            return LaunchView(plan_runner=self.plan_runner, plan_delay=self.plan_delay, stop_grace=self.stop_grace, id="launch-view")
        if name == "monitor":
            from ._views.monitor import MonitorView

            from . import _run_list

            return MonitorView(
                poll_interval=self.poll_interval,
                stop_grace=self.stop_grace,
                launch_spec=lambda: self.launch_view.plan.spec,
                run_roots=_run_list.DEFAULT_RUN_ROOTS if self.run_roots is None else self.run_roots,
                list_interval=self.list_interval,
                id="monitor-view",
            )
        if name == "checkpoints":
            from ._views.checkpoints import CheckpointsView

            return CheckpointsView(id="checkpoints-view")
        if name == "logs":
            from ._views.logs import LogView

            return LogView(id="log-view")
        from ._views.hardware import HardwareView

        return HardwareView(self.hardware, interval=self.hardware_interval, id="hardware-view")

    def _view(self, name: str) -> View:
        if name not in self._views:
            self._views[name] = self._build_view(name)
        return self._views[name]

    @property
    def launch_view(self) -> LaunchView:
        return cast("LaunchView", self._view("launch"))

    @property
    def monitor_view(self) -> MonitorView:
        return cast("MonitorView", self._view("monitor"))

    @property
    def checkpoints_view(self) -> CheckpointsView:
        return cast("CheckpointsView", self._view("checkpoints"))

    @property
    def log_view(self) -> LogView:
        return cast("LogView", self._view("logs"))

    @property
    def hardware_view(self) -> HardwareView:
        return cast("HardwareView", self._view("hardware"))

    def compose(self) -> ComposeResult:
        initial = "monitor" if self.run_dir else "launch"
        titles = {"launch": "1 Launch", "monitor": "2 Monitor", "checkpoints": "3 Checkpoints", "logs": "4 Logs", "hardware": "5 Hardware"}
        with TabbedContent(initial=initial, id="views"):
            for pane_id, title in titles.items():
                with TabPane(title, id=pane_id):
                    # the hidden views are built and mounted after the first frame: a faster start
                    yield self._view(pane_id) if pane_id == initial else Deferred(partial(self._view, pane_id))
        yield Footer()

    def on_mount(self) -> None:
        for run_dir in reversed(self.run_dirs):  # the first one ends up watched
            self.open_run(run_dir)

    def open_run(self, run_dir: Path, process: subprocess.Popen[bytes] | None = None) -> None:
        """List and watch `run_dir` in the Monitor; the other views follow (`RunSelected`)."""
        self.monitor_view.open_run(run_dir, process)
        if not self.monitor_view.is_mounted:
            self._follow_run(run_dir)

    def _follow_run(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.checkpoints_view.open_run(run_dir)
        self.log_view.show_run(run_dir)

    def on_monitor_view_run_selected(self, event: MonitorView.RunSelected) -> None:
        self._follow_run(event.run_dir)

    def on_monitor_view_log_update(self, event: MonitorView.LogUpdate) -> None:
        if event.run_dir == self.run_dir:
            self.log_view.add(event.read)

    def on_monitor_view_show_log(self, event: MonitorView.ShowLog) -> None:
        self.action_show_view("logs")
        self.log_view.go_to_last_error()

    def on_checkpoints_view_resume_requested(self, event: CheckpointsView.ResumeRequested) -> None:
        self.monitor_view.resume(event.run_dir, event.step_dir, launched=lambda: self.action_show_view("monitor"))

    def on_launch_view_launched(self, event: LaunchView.Launched) -> None:
        self.open_run(event.output_dir, event.process)
        if event.process is not None:
            self.action_show_view("monitor")

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id == "checkpoints" and self.checkpoints_view.is_mounted:
            selected = self.monitor_view.selected_run if self.monitor_view.is_mounted else None
            if selected is not None and selected != self.checkpoints_view.run_dir:
                self.checkpoints_view.open_run(selected)  # the run highlighted in the Monitor
            else:
                self.checkpoints_view.action_refresh()
        self.call_after_refresh(self._focus_active_view)

    def _focus_active_view(self) -> None:
        active = self.query_one("#views", TabbedContent).active
        try:
            self._view(active).focus_main()
        except NoMatches:  # a lazy view mounts (with its children) right after the first frame
            self.call_after_refresh(self._focus_active_view)

    def action_show_view(self, view: str) -> None:
        self.query_one("#views", TabbedContent).active = view

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_leave_field(self) -> None:
        self._focus_active_view()

    def action_open_run(self) -> None:
        self.action_show_view("monitor")
        self.monitor_view.action_open_run()

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Launch view", "Build and run a training launch (1)", lambda: self.action_show_view("launch"))
        yield SystemCommand("Monitor view", "Live metrics of a run (2)", lambda: self.action_show_view("monitor"))
        yield SystemCommand("Checkpoints view", "Browse, convert, verify, publish checkpoints (3)", lambda: self.action_show_view("checkpoints"))
        yield SystemCommand("Logs view", "The watched run's combined log, its events, filter and search (4)", lambda: self.action_show_view("logs"))
        yield SystemCommand("Hardware view", "CPU, RAM and GPU use of this host (5)", lambda: self.action_show_view("hardware"))
        yield SystemCommand("Stop run", "Stop the watched run: SIGINT, then SIGTERM after the grace (x)", self.monitor_view.action_stop_run)
        yield SystemCommand("Resume run", "Resume the watched run from checkpoints/last (r)", self.monitor_view.action_resume_run)
        yield SystemCommand("Open run folder", "Watch a run's output dir", self.action_open_run)
        yield SystemCommand("Copy launch command", "Copy the command as it runs (ctrl+y)", self.launch_view.action_copy_command)
        yield SystemCommand("Run launch", "Start the command, or save the Slurm script (ctrl+r)", self.launch_view.action_run)
        yield SystemCommand("Save preset", "Save the settings as a TrainConfig JSON (ctrl+s)", self.launch_view.action_save_preset)
        yield SystemCommand("Load preset", "Load a TrainConfig JSON into the form (ctrl+o)", self.launch_view.action_load_preset)
        yield SystemCommand("Keys", "Show every key (?)", self.action_help)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="lr-tui", description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", nargs="*", type=Path, help="run folders to list in the Monitor (the first is watched)")
    parser.add_argument(
        "--runs", action="append", default=[], metavar="DIR",
        help=f"also list the runs under DIR in the Monitor (repeat it, or DIR,DIR; {RUNS_ROOT} always)",
    )
    parser.add_argument("--stop-grace", type=float, default=30.0, help="seconds from SIGINT to SIGTERM when stopping a run (default 30)")
    parser.add_argument(VERSION_FLAG, action="store_true", help="print the versions of lr's packages and exit")
    args = parser.parse_args(argv)
    if args.version:
        print(versions_text("lr-tui"))
        return
    for run_dir in args.output_dir:  # a folder not made yet is fine: the Monitor waits for the run to start
        if run_dir.exists() and not run_dir.is_dir():
            parser.error(f"{run_dir} is a file, not a run folder; pass a run's output_dir (the folder of its run.json and metrics.jsonl)")
    roots = [RUNS_ROOT, *(Path(d) for arg in args.runs for d in arg.split(",") if d)]
    LrApp(args.output_dir, stop_grace=args.stop_grace, runs=list(dict.fromkeys(roots))).run()
