"""Resume a run from its `last` checkpoint: change the topology or the steps, see the command, launch.

The screen shows what was saved (step, layout, batch x dp), four fields (processes per
node, dp_replicate, dp_shard, steps; empty keeps the saved value), and on every change the
plan from `resume_plan.plan_resume`: lr-config's exact command and whether the resume is
sample-exact, or lr-config's reason why it cannot run (a new process count without both
degrees, for one). ctrl+r (or enter) dismisses with the argv to launch; escape with None.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static

from lr_config import LaunchSpec

from .._checkpoint_scan import read_training_step
from .._resume_plan import ResumePlan, overrides_from, plan_resume
from .._widgets.text_panel import TextPanel

__all__ = ["ResumeScreen"]

FIELDS = (
    ("nproc_per_node", "processes", "per node"),
    ("dp_replicate", "dp_replicate", "saved"),
    ("dp_shard", "dp_shard", "saved"),
    ("steps", "steps", "saved"),
)


class ResumeScreen(ModalScreen[list[str] | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+r", "launch", "Launch")]
    AUTO_FOCUS = "#resume-steps"

    def __init__(self, output_dir: Path, step_dir: Path, spec: LaunchSpec, fixed: list[str] | None = None) -> None:
        super().__init__()
        self.output_dir = output_dir
        self.step_dir = step_dir
        self.spec = spec
        self.fixed = fixed or []
        """Overrides the form does not show (`--output_dir` when the saved one leads elsewhere)."""
        self.plan: ResumePlan | None = None

    def _saved(self) -> str:
        ts, problem = read_training_step(self.step_dir)
        if ts is None:
            return f"{self.step_dir}: {problem}"
        return (
            f"{self.step_dir.name} (last): step {ts.step}, {ts.topology.describe()}, "
            f"batch {ts.batch_size} x dp {ts.dp_world_size} x accum {ts.grad_accum}"
        )

    def compose(self) -> ComposeResult:
        with Vertical(classes="prompt-box", id="resume-box") as box:
            box.border_title = f"Resume {self.output_dir}"
            box.border_subtitle = "ctrl+r or enter launches, escape cancels"
            yield Static(self._saved(), id="resume-saved", markup=False)
            with Grid(id="resume-fields"):
                for key, label, placeholder in FIELDS:
                    yield Label(label)
                    value = str(self.spec.nproc_per_node) if key == "nproc_per_node" else ""
                    field = Input(value, placeholder=placeholder, id=f"resume-{key.replace('_', '-')}", compact=True)
                    field.cursor_blink = False
                    yield field
            yield Static("", id="resume-exact", markup=False)
            yield TextPanel("command", id="resume-command")

    def on_mount(self) -> None:
        self.refresh_plan()

    def values(self) -> dict[str, str]:
        return {key: self.query_one(f"#resume-{key.replace('_', '-')}", Input).value for key, _, _ in FIELDS}

    def refresh_plan(self) -> None:
        values = self.values()
        exact = self.query_one("#resume-exact", Static)
        command = self.query_one("#resume-command", TextPanel)
        try:
            spec = replace(self.spec, nproc_per_node=int(values["nproc_per_node"]))
        except ValueError:
            self.plan = None
            exact.update("")
            command.show(f"processes: expected an integer, got {values['nproc_per_node']!r}", error=True)
            return
        self.plan = plan = plan_resume(spec, self.step_dir, [*self.fixed, *overrides_from(values)], self.output_dir)
        exact.update(plan.exactness)
        exact.set_class("sample-exact: no" in plan.exactness, "-inexact")
        if plan.ok:
            command.show(plan.preview)
        else:
            command.show("\n".join(plan.problems), error=True)

    def on_input_changed(self, event: Input.Changed) -> None:
        self.refresh_plan()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_launch()

    def action_launch(self) -> None:
        if self.plan is None or self.plan.argv is None:
            self.notify("Fix the settings first.", severity="warning")
            return
        self.dismiss(self.plan.argv)

    def action_cancel(self) -> None:
        self.dismiss(None)
