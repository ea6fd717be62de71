"""A titled, scrollable block of plain text (command preview, plan, logs, details)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

__all__ = ["TextPanel"]


class TextPanel(VerticalScroll):
    """Plain text (no markup, so flags and paths show exactly), scrollable by keys."""

    def __init__(self, title: str, *, id: str, text: str = "") -> None:
        super().__init__(id=id, classes="text-panel")
        self.border_title = title
        self._text = text

    def compose(self) -> ComposeResult:
        yield Static(self._text, markup=False, classes="text-panel-body")

    @property
    def text(self) -> str:
        return self._text

    def show(self, text: str, *, subtitle: str = "", error: bool = False, follow: bool = False) -> None:
        if (text, subtitle, error) == (self._text, self.border_subtitle, self.has_class("-error")):
            return
        self._text = text
        self.border_subtitle = subtitle
        self.set_class(error, "-error")
        self.query_one(".text-panel-body", Static).update(text)
        if follow:
            self.call_after_refresh(self.scroll_end, animate=False)

    def set_subtitle(self, subtitle: str) -> None:
        """The line on the bottom border alone (a running task's elapsed seconds)."""
        if self.border_subtitle != subtitle:
            self.border_subtitle = subtitle
