"""One field of the Launch form: a label, an input or a select, and lr-config's lines for it."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Grid
from textual.widgets import Input, Label, Select, Static

from .._launch_form import FormField

__all__ = ["FormRow"]


class FormRow(Grid):
    """A 2-column grid (label, control) with the error line spanning both columns."""

    def __init__(self, field: FormField, value: str) -> None:
        super().__init__(id=f"row-{field.key}", classes="form-row")
        self.field = field
        self._initial = value
        self._shown: tuple[list[str], bool] = ([], False)
        self.control: Input | Select[str]

    def compose(self) -> ComposeResult:
        key = self.field.key
        yield Label(self.field.label, classes="form-label")
        if self.field.options:
            self.control = Select(self.field.options, value=self._initial, allow_blank=False, compact=True, id=f"field-{key}")
        else:
            self.control = Input(self._initial, placeholder=self.field.placeholder, compact=True, id=f"field-{key}")
            self.control.cursor_blink = False
        yield self.control
        yield Static("", classes="form-error", id=f"error-{key}", markup=False)

    @property
    def value(self) -> str:
        value = self.control.value
        return value if isinstance(value, str) else ""

    def set_value(self, value: str) -> None:
        self.control.value = value

    def show_problems(self, lines: list[str], *, marked: bool = False) -> None:
        """Show lr-config's lines under the field; `marked` flags it without text."""
        if (lines, marked) == self._shown:
            return
        self._shown = (lines, marked)
        self.query_one(".form-error", Static).update("\n".join(lines))
        self.set_class(bool(lines), "-invalid")
        self.set_class(marked and not lines, "-marked")
