"""A log of many lines, drawn one visible line at a time: filter, search, event marks.

Lines keep their number in the file (the gutter shows it; events point at it). Only the
lines the `LogFilter` keeps are listed; a line where an event was found is coloured by its
severity; the search text is highlighted, and the current match (or the event jumped to)
is the cursor line. It follows the end of the log while scrolled to the bottom.
At most `MAX_LINES` lines are kept, the oldest dropped first.
"""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from .._events import Severity, split_prefix
from .._log_filter import LogFilter

__all__ = ["LogLines"]

MAX_LINES = 200_000
SEVERITY_STYLE: dict[Severity, Style] = {
    "error": Style(color="#ff6b6b", bold=True),
    "warning": Style(color="#e5c07b"),
    "info": Style(color="#98c379"),
}
PREFIX_STYLE = Style(dim=True)
GUTTER_STYLE = Style(dim=True)
MATCH_STYLE = Style(reverse=True)
CURSOR_STYLE = Style(bgcolor="#3a3a5a")


class LogLines(ScrollView, can_focus=True):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.lines: list[str] = []
        self.first = 1
        """The line number of lines[0]."""
        self.marks: dict[int, Severity] = {}
        self.filter = LogFilter()
        self.shown: list[int] = []
        self.search = ""
        self.cursor: int | None = None
        self.following = True
        """At the end of the log: new lines scroll into view."""
        self._width = 0

    # --- content ---------------------------------------------------------------------------

    def clear(self) -> None:
        self.lines, self.first, self.marks, self.shown, self.cursor, self._width = [], 1, {}, [], None, 0
        self._resize(follow=True)

    def append(self, lines: list[str]) -> None:
        if not lines:
            return
        follow = self.following
        start = self.first + len(self.lines)
        self.lines.extend(lines)
        self.shown.extend(n for n, line in enumerate(lines, start) if self._keeps(n, line))
        self._width = max(self._width, *(len(line) for line in lines))
        if len(self.lines) > MAX_LINES:
            drop = len(self.lines) - MAX_LINES
            self.lines = self.lines[drop:]
            self.first += drop
            self.shown = [n for n in self.shown if n >= self.first]
        self._resize(follow=follow)

    def set_marks(self, marks: dict[int, Severity]) -> None:
        self.marks = marks
        if self.filter.events_only:
            self._refilter()
        self.refresh()

    def set_filter(self, log_filter: LogFilter) -> None:
        self.filter = log_filter
        self._refilter()

    def set_search(self, text: str) -> None:
        self.search = text.lower()
        self.refresh()

    def line(self, number: int) -> str:
        return self.lines[number - self.first]

    def _keeps(self, number: int, line: str) -> bool:
        return self.filter.empty or self.filter.matches(line, number in self.marks)

    def _refilter(self) -> None:
        self.shown = [n for n, line in enumerate(self.lines, self.first) if self._keeps(n, line)]
        self._resize(follow=self.cursor is None)
        if self.cursor is not None:
            self.jump_to(self.cursor)

    def _gutter(self) -> int:
        return len(str(self.first + len(self.lines))) + 1

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if self.size.height and new_value != old_value:
            self.following = self.is_vertical_scroll_end and self.cursor is None

    def on_resize(self) -> None:
        if self.following:
            self.scroll_end(animate=False, immediate=True, x_axis=False)

    def _resize(self, *, follow: bool) -> None:
        self.virtual_size = Size(self._gutter() + self._width, len(self.shown))
        if follow:
            self.call_after_refresh(self.scroll_end, animate=False, immediate=True, x_axis=False)
        self.refresh()

    # --- moving ----------------------------------------------------------------------------

    def jump_to(self, number: int) -> bool:
        """Make line `number` the cursor line and scroll it into the middle; False if filtered out."""
        try:
            row = self.shown.index(number)
        except ValueError:
            return False
        self.cursor = number
        self.following = False
        # after the next refresh: a view just shown has no height yet
        self.call_after_refresh(lambda: self.scroll_to(y=max(0, row - self.size.height // 2), animate=False, immediate=True))
        self.refresh()
        return True

    def matches(self) -> list[int]:
        return [n for n in self.shown if self.search and self.search in self.line(n).lower()]

    def next_match(self, direction: int = 1) -> int | None:
        """Move the cursor to the next (or previous) line containing the search text."""
        found = self.matches()
        if not found:
            return None
        here = self.cursor if self.cursor is not None else (self.first - 1 if direction > 0 else self.first + len(self.lines))
        ahead = [n for n in found if (n > here if direction > 0 else n < here)]
        target = (ahead[0] if direction > 0 else ahead[-1]) if ahead else (found[0] if direction > 0 else found[-1])
        self.jump_to(target)
        return target

    def follow(self) -> None:
        """Drop the cursor and follow the end again."""
        self.cursor = None
        self.following = True
        self._resize(follow=True)

    # --- drawing ---------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        row = scroll_y + y
        if row >= len(self.shown):
            return Strip.blank(width, self.rich_style)
        number = self.shown[row]
        strip = Strip(list(self._text(number).render(self.app.console)))
        return strip.crop_extend(scroll_x, scroll_x + width, self.rich_style)

    def _text(self, number: int) -> Text:
        line = self.line(number)
        gutter = self._gutter()
        text = Text(f"{number:>{gutter - 1}} ", style=GUTTER_STYLE, no_wrap=True, end="")
        _, rest = split_prefix(line)
        prefix = line[: len(line) - len(rest)]
        body = Text(prefix, style=PREFIX_STYLE, end="")
        body.append(rest, style=SEVERITY_STYLE.get(self.marks[number]) if number in self.marks else None)
        if self.search:
            lower = line.lower()
            start = lower.find(self.search)
            while start >= 0:
                body.stylize(MATCH_STYLE, start, start + len(self.search))
                start = lower.find(self.search, start + len(self.search))
        text.append_text(body)
        if number == self.cursor:
            text.stylize(CURSOR_STYLE)
            text.pad_right(max(0, self.size.width + self.scroll_offset.x - len(text)))
            text.stylize(CURSOR_STYLE)
        return text
