"""A one-line choice among fixed options: one widget where Textual's `Select` mounts six.

The Launch form has five choices; as `Select`s they were 30 of the first frame's 143
widgets, each styled three times before the first frame (mount, screen resume, focus).
`Choice` renders `value ▼` itself. Enter, space or a click opens the options in a small
modal menu under it (built only then); left and right step through them in place.
"""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.geometry import Region
from textual.message import Message
from textual.reactive import reactive
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import OptionList

__all__ = ["Choice", "ChoiceMenu"]


class ChoiceMenu(ModalScreen[str | None]):
    """The options of a `Choice`, placed under it; dismisses with the chosen value or None."""

    DEFAULT_CSS = """
    ChoiceMenu {
        background: $background 0%;
        align: left top;
    }
    ChoiceMenu > OptionList {
        width: auto;
        height: auto;
        max-height: 12;
        border: tall $border;
        background: $surface;
    }
    """
    BINDINGS = [Binding("escape", "close", "Close", show=False)]

    def __init__(self, options: tuple[tuple[str, str], ...], current: str, under: Region) -> None:
        super().__init__()
        self.options = options
        self.current = current
        self.under = under

    def compose(self) -> ComposeResult:
        yield OptionList(*(label for label, _ in self.options))

    def on_mount(self) -> None:
        menu = self.query_one(OptionList)
        menu.styles.offset = (max(self.under.x - 1, 0), self.under.bottom)
        menu.styles.min_width = self.under.width + 2
        values = [value for _, value in self.options]
        menu.highlighted = values.index(self.current) if self.current in values else 0
        menu.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(self.options[event.option_index][1])

    def on_click(self, event: events.Click) -> None:
        if event.widget is self:  # outside the options
            self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)


class Choice(Widget, can_focus=True):
    """`options` are (label, value); `value` is the chosen value (any string may be set: one
    that is no option shows as it is, and lr-config's validation names it)."""

    DEFAULT_CSS = """
    Choice {
        width: 1fr;
        height: 1;
        background: $surface;
        color: $foreground;
        padding: 0 1 0 0;
        pointer: pointer;
    }
    Choice:focus {
        background-tint: $foreground 5%;
    }
    """
    BINDINGS = [
        Binding("enter,space", "open", "Choose", show=False),
        Binding("left", "step(-1)", "Previous", show=False),
        Binding("right", "step(1)", "Next", show=False),
    ]

    value: reactive[str] = reactive("", layout=False)

    class Changed(Message):
        """The value changed (by the user or by code)."""

        def __init__(self, choice: Choice, value: str) -> None:
            super().__init__()
            self.choice = choice
            self.value = value

        @property
        def control(self) -> Choice:
            return self.choice

    def __init__(self, options: tuple[tuple[str, str], ...], value: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.options = options
        self.set_reactive(Choice.value, value)

    def _label(self) -> str:
        return next((label for label, value in self.options if value == self.value), self.value)

    def render(self) -> Text:
        width = max(self.content_size.width - 2, 1)
        return Text(self._label()[:width].ljust(width)) + Text(" ▼", style="dim")

    def watch_value(self, value: str) -> None:
        self.post_message(self.Changed(self, value))

    def action_step(self, delta: int) -> None:
        values = [value for _, value in self.options]
        index = values.index(self.value) if self.value in values else -delta
        self.value = values[(index + delta) % len(values)]

    def action_open(self) -> None:
        def chosen(value: str | None) -> None:
            if value is not None:
                self.value = value
            self.focus()

        self.app.push_screen(ChoiceMenu(self.options, self.value, self.region), chosen)

    def on_click(self, event: events.Click) -> None:
        event.stop()
        self.focus()
        self.action_open()
