"""One field of the Launch form: a label, an input or a choice, and lr-config's lines for it."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Grid
from textual.widgets import Input, Label, Static

from .._launch_form import FormField
from .choice import Choice

__all__ = ["FormRow"]


class FormRow(Grid):
    """A 2-column grid (label, control) with the error line spanning both columns.

    The error line is mounted the first time the field has one: most fields never do, and
    each widget of the first frame costs start-up time (see `tools/bench/startup.py`)."""

    def __init__(self, field: FormField, value: str) -> None:
        super().__init__(id=f"row-{field.key}", classes="form-row")
        self.field = field
        self._initial = value
        self._shown: tuple[list[str], bool] = ([], False)
        self._error: Static | None = None
        self.control: Input | Choice

    def compose(self) -> ComposeResult:
        key = self.field.key
        yield Label(self.field.label, classes="form-label")
        if self.field.options:
            self.control = Choice(self.field.options, self._initial, id=f"field-{key}")
        else:
            # validate_on=(): lr-config validates; Input's own check only toggles a class,
            # and each toggle restyles the field (16 restyles before the first frame)
            self.control = Input(self._initial, placeholder=self.field.placeholder, compact=True, validate_on=(), id=f"field-{key}")
            self.control.cursor_blink = False
        yield self.control

    @property
    def value(self) -> str:
        return self.control.value

    def set_value(self, value: str) -> None:
        self.control.value = value

    def show_problems(self, lines: list[str], *, marked: bool = False) -> None:
        """Show lr-config's lines under the field; `marked` flags it without text."""
        if (lines, marked) == self._shown:
            return
        self._shown = (lines, marked)
        text = "\n".join(lines)
        if self._error is not None:
            self._error.update(text)
        elif lines:
            self._error = Static(text, classes="form-error", id=f"error-{self.field.key}", markup=False)
            self.mount(self._error)
        self.set_class(bool(lines), "-invalid")
        self.set_class(marked and not lines, "-marked")
