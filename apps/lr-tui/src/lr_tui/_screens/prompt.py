"""Small modal questions: a line of text checked as it is typed (with completion, e.g. of
folder names), or a choice from a list."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.suggester import Suggester
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

__all__ = ["ChoicePrompt", "DirectorySuggester", "TextPrompt"]


class DirectorySuggester(Suggester):
    """Completes the last part of a path to the first folder of that name in the folder typed
    so far (`outputs/tr` -> `outputs/train/`); hidden folders only once a dot is typed."""

    def __init__(self) -> None:
        super().__init__(use_cache=False, case_sensitive=True)

    async def get_suggestion(self, value: str) -> str | None:
        head, _, prefix = value.rpartition("/")
        folder = Path(os.path.expanduser(head + "/" if head or value.startswith("/") else "."))
        try:
            with os.scandir(folder) as entries:
                names = sorted(e.name for e in entries if e.is_dir() and e.name.startswith(prefix) and (prefix[:1] == "." or e.name[:1] != "."))
        except OSError:
            return None
        return f"{value[: len(value) - len(prefix)]}{names[0]}/" if names else None


class TextPrompt(ModalScreen[str | None]):
    """Ask for one value; `check` returns the problem with it, or None when it is fine. With a
    `suggester`, its completion shows greyed after the text, and tab or right accepts it."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("tab", "complete", "Complete", show=False)]
    AUTO_FOCUS = "*"

    def __init__(
        self, title: str, value: str = "", *, check: Callable[[str], str | None] | None = None, suggester: Suggester | None = None
    ) -> None:
        super().__init__()
        self.title_text = title
        self.initial = value
        self.check = check or (lambda _: None)
        self.suggester = suggester

    def compose(self) -> ComposeResult:
        with Vertical(classes="prompt-box") as box:
            box.border_title = self.title_text
            box.border_subtitle = "enter accepts, escape cancels"
            field = Input(self.initial, id="prompt-input", suggester=self.suggester)
            field.cursor_blink = False
            yield field
            yield Static("", id="prompt-error", markup=False)

    def action_complete(self) -> None:
        """Accept the completion shown (as right does at the end of the text)."""
        field = self.query_one("#prompt-input", Input)
        field.cursor_position = len(field.value)
        field.action_cursor_right()

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
