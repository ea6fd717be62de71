"""Small modal questions: a line of text checked as it is typed, or a choice from a list."""

from __future__ import annotations

from collections.abc import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

__all__ = ["ChoicePrompt", "TextPrompt"]


class TextPrompt(ModalScreen[str | None]):
    """Ask for one value; `check` returns the problem with it, or None when it is fine."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    AUTO_FOCUS = "*"

    def __init__(self, title: str, value: str = "", *, check: Callable[[str], str | None] | None = None) -> None:
        super().__init__()
        self.title_text = title
        self.initial = value
        self.check = check or (lambda _: None)

    def compose(self) -> ComposeResult:
        with Vertical(classes="prompt-box") as box:
            box.border_title = self.title_text
            box.border_subtitle = "enter accepts, escape cancels"
            field = Input(self.initial, id="prompt-input")
            field.cursor_blink = False
            yield field
            yield Static("", id="prompt-error", markup=False)

    def on_input_changed(self, event: Input.Changed) -> None:
        self.query_one("#prompt-error", Static).update(self.check(event.value) or "")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        problem = self.check(event.value)
        if problem:
            self.query_one("#prompt-error", Static).update(problem)
            return
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ChoicePrompt(ModalScreen[str | None]):
    """Pick one of `choices` (value, description)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    AUTO_FOCUS = "*"

    def __init__(self, title: str, choices: list[tuple[str, str]]) -> None:
        super().__init__()
        self.title_text = title
        self.choices = choices

    def compose(self) -> ComposeResult:
        with Vertical(classes="prompt-box") as box:
            box.border_title = self.title_text
            box.border_subtitle = "enter picks, escape cancels"
            yield OptionList(*[Option(f"{value:<6} {text}", id=value) for value, text in self.choices], id="prompt-choices")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
