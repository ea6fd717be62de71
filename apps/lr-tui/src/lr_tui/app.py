"""`lr-tui [OUTPUT_DIR]`: build launches, watch runs, browse checkpoints.

Three views in tabs (keys 1/2/3): Launch, Monitor, Checkpoints; `?` shows every key and
ctrl+p the command palette. Opening with OUTPUT_DIR starts on its Monitor. The app never
imports torch: it reads files and runs lr's CLIs as subprocesses.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path

from textual.app import App, ComposeResult, SystemCommand
from textual.screen import Screen
from textual.widgets import Footer, TabbedContent, TabPane

from .keymap import APP_BINDINGS
from .screens.help import HelpScreen
from .views.checkpoints import CheckpointsView
from .views.launch import LaunchView, PlanRunner, run_plan
from .views.monitor import MonitorView

__all__ = ["LrApp", "main"]

VIEWS = ("launch", "monitor", "checkpoints")


class LrApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "lr"
    BINDINGS = APP_BINDINGS

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
        with TabbedContent(initial="monitor" if self.run_dir else "launch", id="views"):
            with TabPane("1 Launch", id="launch"):
                yield LaunchView(plan_runner=self.plan_runner, plan_delay=self.plan_delay, id="launch-view")
            with TabPane("2 Monitor", id="monitor"):
                yield MonitorView(poll_interval=self.poll_interval, id="monitor-view")
            with TabPane("3 Checkpoints", id="checkpoints"):
                yield CheckpointsView(resume_context=self._resume_context, id="checkpoints-view")
        yield Footer()

    def on_mount(self) -> None:
        if self.run_dir is not None:
            self.open_run(self.run_dir)
        self.call_after_refresh(self._focus_active_view)

    @property
    def launch_view(self) -> LaunchView:
        return self.query_one(LaunchView)

    @property
    def monitor_view(self) -> MonitorView:
        return self.query_one(MonitorView)

    @property
    def checkpoints_view(self) -> CheckpointsView:
        return self.query_one(CheckpointsView)

    def _resume_context(self) -> tuple[object, list[str]]:
        return self.launch_view.resume_context()

    def open_run(self, run_dir: Path, process: object = None) -> None:
        """Show `run_dir` in the Monitor and Checkpoints views."""
        self.run_dir = run_dir
        self.monitor_view.open_run(run_dir, process)  # type: ignore[arg-type]
        self.checkpoints_view.open_run(run_dir)

    def on_launch_view_launched(self, event: LaunchView.Launched) -> None:
        self.open_run(event.output_dir, event.process)
        if event.process is not None:
            self.action_show_view("monitor")

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id == "checkpoints":
            self.checkpoints_view.action_refresh()
        self.call_after_refresh(self._focus_active_view)

    def _focus_active_view(self) -> None:
        active = self.query_one("#views", TabbedContent).active
        {"launch": self.launch_view, "monitor": self.monitor_view, "checkpoints": self.checkpoints_view}[active].focus_main()

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

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
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
