"""Resume a run from one of its checkpoints: change the topology, the steps or the format, see the command, launch.

The screen shows what was saved (step, layout, batch x dp, precision) and a field for each
setting a resume may change and lr-config's messages ask for: processes per node,
dp_replicate, dp_shard, steps, the checkpoint format of the next saves, and "more flags"
(any other `--a.b=c`); empty keeps the saved value. On every change it shows the plan from
`resume_plan.plan_resume`: lr-config's exact command (as it runs) and whether the resume is
sample-exact, or lr-config's reason why it cannot run, with the fields that reason asks to
change marked and named (`resume_plan.fields_named`), so each fix is made right there.
ctrl+r (or enter in a field) dismisses with the argv to launch; ctrl+y copies the command;
escape dismisses with None.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static

from lr_config import CHECKPOINT_FORMATS, ConfigError, LaunchSpec, resume_config

from .._checkpoint_scan import read_training_step
from .._clipboard import copy_text
from .._resume_plan import EXTRA, PROCESSES, ResumePlan, fields_named, overrides_from, plan_resume
from .._widgets.choice import Choice
from .._widgets.text_panel import TextPanel

__all__ = ["FIELDS", "ResumeScreen"]

FIELDS = (
    (PROCESSES, "processes", "per node"),
    ("dp_replicate", "dp_replicate", "saved"),
    ("dp_shard", "dp_shard", "saved"),
    ("steps", "steps", "saved"),
    ("checkpoint_format", "ckpt format", ""),
    (EXTRA, "more flags", "--a.b=c ..."),
)
"""(key, label, placeholder) of the resume form, in order."""

_LABELS = {key: label for key, label, _ in FIELDS}


def field_id(key: str) -> str:
    return f"resume-{key.replace('_', '-')}"


class ResumeScreen(ModalScreen[list[str] | None]):
    BINDINGS = [
        Binding("escape", "cancel", "Cancel"),
        Binding("ctrl+r", "launch", "Launch"),
        Binding("ctrl+y", "copy_command", "Copy"),
    ]
    AUTO_FOCUS = "#resume-steps"

    def __init__(self, output_dir: Path, step_dir: Path, spec: LaunchSpec, fixed: list[str] | None = None, *, is_last: bool = True) -> None:
        super().__init__()
        self.output_dir = output_dir
        self.step_dir = step_dir
        self.spec = spec
        self.fixed = fixed or []
        """Overrides the form does not show (`--output_dir` when the saved one leads elsewhere)."""
        self.is_last = is_last
        self.plan: ResumePlan | None = None

    def _saved(self) -> str:
        ts, problem = read_training_step(self.step_dir)
        if ts is None:
            return f"{self.step_dir}: {problem}"
        return (
            f"{self.step_dir.name}{' (last)' if self.is_last else ''}: step {ts.step}, {ts.topology.describe()}, "
            f"batch {ts.batch_size} x dp {ts.dp_world_size} x accum {ts.grad_accum}, precision {ts.precision}, "
            f"saved as {ts.checkpoint_format}"
        )

    def _saved_settings(self) -> dict[str, str]:
        """Each field's placeholder: the value the resume keeps when the field is left empty."""
        try:
            cfg = resume_config(self.step_dir)
        except (ConfigError, OSError, ValueError):  # the plan below says what is wrong with it
            return {}
        par = cfg.parallelism

        def degree(value: int | None) -> str:
            return "auto" if value is None else "-1 (infer)" if value == -1 else str(value)

        return {
            "dp_replicate": f"saved: {degree(par.dp_replicate)}",
            "dp_shard": f"saved: {degree(par.dp_shard)}",
            "steps": f"saved: {cfg.steps}",
            "checkpoint_format": cfg.checkpoint_format,
        }

    def _format_options(self, saved: str) -> tuple[tuple[str, str], ...]:
        """"<format> (as saved)" first: empty keeps the saved config's format for the next saves."""
        return ((f"{saved} (as saved)", ""), *((f, f) for f in CHECKPOINT_FORMATS if f != saved))

    def compose(self) -> ComposeResult:
        with Vertical(classes="prompt-box", id="resume-box") as box:
            box.border_title = f"Resume {self.output_dir}" + ("" if self.is_last else f" from {self.step_dir.name}")
            box.border_subtitle = "ctrl+r or enter launches, ctrl+y copies, escape cancels"
            yield Static(self._saved(), id="resume-saved", markup=False)
            saved = self._saved_settings()
            with Grid(id="resume-fields"):
                for key, label, placeholder in FIELDS:
                    yield Label(label, id=f"{field_id(key)}-label", classes="resume-label")
                    if key == "checkpoint_format":
                        yield Choice(self._format_options(saved.get(key, "?")), "", id=field_id(key))
                        continue
                    value = str(self.spec.nproc_per_node) if key == PROCESSES else ""
                    placeholder = saved.get(key, placeholder)
                    field = Input(value, placeholder=placeholder, id=field_id(key), compact=True, validate_on=())
                    field.cursor_blink = False
                    yield field
            yield Static("", id="resume-exact", markup=False)
            yield TextPanel("command", id="resume-command")

    def on_mount(self) -> None:
        self.refresh_plan()

    def values(self) -> dict[str, str]:
        return {key: str(self.query_one(f"#{field_id(key)}").value) for key, _, _ in FIELDS}  # type: ignore[attr-defined]

    def _mark(self, keys: list[str]) -> None:
        for key, _, _ in FIELDS:
            self.query_one(f"#{field_id(key)}-label", Label).set_class(key in keys, "-invalid")

    def _refuse(self, problems: list[str]) -> None:
        """Show why there is no command, and mark (and name) the fields that fix it."""
        keys = [key for key in _LABELS if any(key in fields_named(line) for line in problems)]
        self._mark(keys)
        text = "\n".join(problems)
        if keys:
            text += "\n\n→ change " + ", ".join(_LABELS[key] for key in keys) + " above"
        self.query_one("#resume-command", TextPanel).show(text, error=True)

    def refresh_plan(self) -> None:
        values = self.values()
        exact = self.query_one("#resume-exact", Static)
        command = self.query_one("#resume-command", TextPanel)
        self.plan = None
        exact.update("")
        exact.display = False
        try:
            spec = replace(self.spec, nproc_per_node=int(values[PROCESSES]))
        except ValueError:
            self._refuse([f"processes: expected an integer, got {values[PROCESSES]!r}"])
            return
        try:
            overrides = overrides_from(values)
        except ValueError as exc:
            self._refuse([f"more flags: {exc}"])
            return
        self.plan = plan = plan_resume(spec, self.step_dir, [*self.fixed, *overrides], self.output_dir)
        exact.update(plan.exactness)
        exact.display = bool(plan.exactness)
        exact.set_class("sample-exact: no" in plan.exactness, "-inexact")
        if plan.ok:
            self._mark([])
            command.show(plan.preview, subtitle="ctrl+y copies")
        else:
            self._refuse(plan.problems)

    def on_input_changed(self, event: Input.Changed) -> None:
        self.refresh_plan()

    def on_choice_changed(self, event: Choice.Changed) -> None:
        self.refresh_plan()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_launch()

    def action_launch(self) -> None:
        if self.plan is None or self.plan.argv is None:
            self.notify("Fix the settings first: the marked fields.", severity="warning")
            return
        self.dismiss(self.plan.argv)

    def action_copy_command(self) -> None:
        if self.plan is None or not self.plan.ok:
            self.notify("Fix the settings first: the marked fields.", severity="warning")
            return
        copy_text(self.app, self.plan.preview, "the resume command", "the dialog's command panel")

    def action_cancel(self) -> None:
        self.dismiss(None)
