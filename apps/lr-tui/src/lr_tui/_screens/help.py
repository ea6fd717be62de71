"""The help screen: every key, by view (read from keymap.HELP)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from .._keymap import HELP

__all__ = ["HelpScreen"]


def help_text() -> str:
    lines: list[str] = []
    for section, rows in HELP:
        lines.append(section)
        lines += [f"  {key:<16} {what}" for key, what in rows]
        lines.append("")
    lines.append("Command preview, plan and resume commands are built by lr-config;")
    lines.append("heavy work runs as lr-engine / lr-checkpoint / lr-publish subprocesses.")
    return "\n".join(lines)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close")]
    AUTO_FOCUS = "*"

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box") as box:
            box.border_title = "lr-tui keys"
            box.border_subtitle = "escape closes"
            yield Static(help_text(), markup=False)
