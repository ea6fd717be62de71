"""`lr-tui [OUTPUT_DIR]`: build launches, watch runs, browse checkpoints.

Three views in tabs (keys 1/2/3): Launch, Monitor, Checkpoints; `?` shows every key and
ctrl+p the command palette. Opening with OUTPUT_DIR starts on its Monitor. The app never
imports torch: it reads files and runs lr's CLIs as subprocesses.
"""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from textual.app import App, ComposeResult, SystemCommand
from textual.lazy import Lazy
from textual.screen import Screen
from textual.widgets import Footer, TabbedContent, TabPane

from lr_config import LaunchSpec

from .keymap import APP_BINDINGS
from .screens.help import HelpScreen
from .views.checkpoints import CheckpointsView
from .views.launch import LaunchView, PlanRunner, run_plan
from .views.monitor import MonitorView

__all__ = ["LrApp", "main"]

VIEWS = ("launch", "monitor", "checkpoints")


class LrApp(App[None]):
    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "lr"
    BINDINGS = APP_BINDINGS
    AUTO_FOCUS = "#launch-form, #latest"
    """The main widget of the first view (only that view is mounted at first): one focus
    change at start, where each costs a restyle. Modal screens set their own."""

    launch_view: LaunchView
    monitor_view: MonitorView
    checkpoints_view: CheckpointsView

    def __init__(
        self,
        run_dir: Path | None = None,
        *,
        plan_runner: PlanRunner | None = run_plan,
        plan_delay: float = 0.5,
        poll_interval: float = 0.5,
    ) -> None:
        super().__init__()
        self.run_dir = run_dir
        self.plan_runner = plan_runner
        self.plan_delay = plan_delay
        self.poll_interval = poll_interval

    def compose(self) -> ComposeResult:
        self.launch_view = LaunchView(plan_runner=self.plan_runner, plan_delay=self.plan_delay, id="launch-view")
        self.monitor_view = MonitorView(poll_interval=self.poll_interval, id="monitor-view")
        self.checkpoints_view = CheckpointsView(resume_context=self._resume_context, id="checkpoints-view")
        initial = "monitor" if self.run_dir else "launch"
        panes = {
            "launch": ("1 Launch", self.launch_view),
            "monitor": ("2 Monitor", self.monitor_view),
            "checkpoints": ("3 Checkpoints", self.checkpoints_view),
        }
        with TabbedContent(initial=initial, id="views"):
            for pane_id, (title, view) in panes.items():
                with TabPane(title, id=pane_id):
                    # the hidden views mount after the first frame: a faster start
                    yield view if pane_id == initial else Lazy(view)
        yield Footer()

    def on_mount(self) -> None:
        if self.run_dir is not None:
            self.open_run(self.run_dir)

    def _resume_context(self) -> tuple[LaunchSpec | None, list[str]]:
        return self.launch_view.resume_context()

    def open_run(self, run_dir: Path, process: subprocess.Popen[bytes] | None = None) -> None:
        """Show `run_dir` in the Monitor and Checkpoints views."""
        self.run_dir = run_dir
        self.monitor_view.open_run(run_dir, process)
        self.checkpoints_view.open_run(run_dir)

    def on_launch_view_launched(self, event: LaunchView.Launched) -> None:
        self.open_run(event.output_dir, event.process)
        if event.process is not None:
            self.action_show_view("monitor")

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id == "checkpoints" and self.checkpoints_view.is_mounted:
            self.checkpoints_view.action_refresh()
        self.call_after_refresh(self._focus_active_view)

    def _focus_active_view(self) -> None:
        active = self.query_one("#views", TabbedContent).active
        views: dict[str, LaunchView | MonitorView | CheckpointsView] = {
            "launch": self.launch_view,
            "monitor": self.monitor_view,
            "checkpoints": self.checkpoints_view,
        }
        if views[active].is_mounted:
            views[active].focus_main()
        else:  # a lazy view mounts right after the first frame
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
        yield SystemCommand("Open run folder", "Watch a run's output dir", self.action_open_run)
        yield SystemCommand("Copy launch command", "Copy the command preview (ctrl+y)", self.launch_view.action_copy_command)
        yield SystemCommand("Run launch", "Start the command, or save the Slurm script (ctrl+r)", self.launch_view.action_run)
        yield SystemCommand("Save preset", "Save the settings as a TrainConfig JSON (ctrl+s)", self.launch_view.action_save_preset)
        yield SystemCommand("Load preset", "Load a TrainConfig JSON into the form (ctrl+o)", self.launch_view.action_load_preset)
        yield SystemCommand("Keys", "Show every key (?)", self.action_help)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="lr-tui", description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", nargs="?", type=Path, help="a run folder to open in the Monitor")
    args = parser.parse_args(argv)
    LrApp(args.output_dir).run()
