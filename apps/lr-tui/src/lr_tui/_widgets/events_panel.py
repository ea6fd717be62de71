"""Events of a run's log as coloured text: what happened, where, and what to do."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from .._events import Event, Severity

__all__ = ["EventsPanel", "event_text"]

ICON: dict[Severity, tuple[str, str]] = {
    "error": ("✗", "bold #ff6b6b"),
    "warning": ("!", "bold #e5c07b"),
    "info": ("✓", "#98c379"),
}


def event_text(event: Event) -> Text:
    """Two lines: `✗ L62 rank 1  title (x3)` and `  → advice`."""
    icon, style = ICON[event.severity]
    repeat = f" (x{event.count})" if event.count > 1 else ""
    return Text.assemble(
        (f"{icon} ", style),
        (f"L{event.line_number} {event.where}  ", "dim"),
        (event.title + repeat, style if event.severity != "info" else ""),
        "\n",
        ("  → " + event.advice, "italic dim"),
    )


class EventsPanel(VerticalScroll):
    """The events so far, newest last, scrolled to the end; hidden while there are none."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, classes="events-panel")
        self.events: list[Event] = []

    def compose(self) -> ComposeResult:
        yield Static("", classes="events-body")

    def show(self, events: list[Event]) -> None:
        self.events = events
        self.display = bool(events)
        errors = sum(e.severity == "error" for e in events)
        self.border_title = f"events: {len(events)}" + (f", {errors} error{'s' if errors != 1 else ''}" if errors else "")
        self.border_subtitle = "l: in the log"
        body = Text("\n").join(event_text(e) for e in events)
        self.query_one(".events-body", Static).update(body)
        self.set_class(errors > 0, "-error")
        self.call_after_refresh(self.scroll_end, animate=False)
