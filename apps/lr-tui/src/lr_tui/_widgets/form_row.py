"""One field of the Launch form: a label, an input or a choice, and lr-config's lines for it."""

from __future__ import annotations

import asyncio

from lr_config import ConfigError, all_flag_paths
from lr_config.datasets import cached_dataset_ids
from textual.app import ComposeResult
from textual.containers import Grid
from textual.suggester import Suggester
from textual.widgets import Input, Label, Static

from .._launch_form import FormField
from .choice import Choice

__all__ = ["DatasetIdSuggester", "FlagSuggester", "FormRow"]


class FlagSuggester(Suggester):
    """Completes the flag being typed at the end of the text (`--policy.n_bl` ->
    `--policy.n_blocks=`) from every `lr-engine train` flag, the installed policy plugins' included."""

    def __init__(self) -> None:
        super().__init__(use_cache=True, case_sensitive=True)
        self._flags: list[str] | None = None

    @staticmethod
    def _all_flags() -> list[str]:
        try:
            return sorted(all_flag_paths())
        except ConfigError:  # a broken plugin: the form's plan names it
            return []

    async def get_suggestion(self, value: str) -> str | None:
        token = value.rpartition(" ")[2]
        if not token.startswith("--") or "=" in token or len(token) < 3:
            return None
        if self._flags is None:  # the first time, off the event loop (about 0.1 s: every field's type, the plugins)
            self._flags = await asyncio.to_thread(self._all_flags)
        name = token[2:]
        match = next((flag for flag in self._flags if flag.startswith(name)), None)
        return None if match is None else f"{value}{match[len(name):]}="


class DatasetIdSuggester(Suggester):
    """Completes a dataset repo id from those on this machine (`lr_config.datasets.cached_dataset_ids`:
    the demo, LeRobot's downloads, the Hugging Face cache), read when the field is first typed in."""

    def __init__(self) -> None:
        super().__init__(use_cache=True, case_sensitive=True)
        self._ids: list[str] | None = None

    async def get_suggestion(self, value: str) -> str | None:
        if self._ids is None:
            self._ids = await asyncio.to_thread(cached_dataset_ids)  # scans two cache folders: off the event loop
        return next((i for i in self._ids if i.startswith(value) and i != value), None) if value else None


def _suggester(kind: str) -> Suggester | None:
    if kind == "flags":
        return FlagSuggester()
    if kind == "datasets":
        return DatasetIdSuggester()
    if kind == "folders":
        from .._screens.prompt import DirectorySuggester

        return DirectorySuggester()
    return None


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
            suggester = _suggester(self.field.completes)
            self.control = Input(self._initial, placeholder=self.field.placeholder, compact=True, validate_on=(), id=f"field-{key}", suggester=suggester)
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
