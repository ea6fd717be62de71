"""The Logs view: the combined log of the run the Monitor watches, with filter, search and events.

The Monitor's worker tails the log (`run_state.LogWatch`) and the app hands each read to
`LogView.add(...)`, so the file is read and parsed once. The filter (`LogFilter`: words,
`rank:N`, `events`) narrows the lines as it is typed; the search highlights its text and
enter / n / N move between matches; the events list below names each event with its line
and what to do, and enter on one jumps to its line.
"""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from .._events import Event
from .._keymap import LOG_BINDINGS
from .._log_filter import LogFilter
from .._run_state import LogRead
from .._widgets.events_panel import event_text
from .._widgets.log_lines import LogLines

__all__ = ["LogView"]


class LogView(Vertical):
    BINDINGS = LOG_BINDINGS

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.run_dir: Path | None = None
        self.path: Path | None = None
        self.events: list[Event] = []
        self._pending: list[LogRead] = []
        """Reads that arrived before the view mounted (it mounts lazily)."""
        self._ready = False

    def compose(self) -> ComposeResult:
        yield Static("no run open", id="log-title", markup=False)
        with Horizontal(id="log-inputs"):
            filter_input = Input(placeholder="filter: words, rank:N, events", id="log-filter", compact=True)
            search_input = Input(placeholder="search (enter, n, N: next match)", id="log-search", compact=True)
            filter_input.cursor_blink = search_input.cursor_blink = False
            yield filter_input
            yield search_input
        yield LogLines(id="log-lines")
        events = OptionList(id="log-events")
        events.border_title = "events (enter: go to its line)"
        yield events

    def on_mount(self) -> None:
        self._ready = True
        pending, self._pending = self._pending, []
        self._title()
        for read in pending:
            self.add(read)

    @property
    def lines(self) -> LogLines:
        return self.query_one("#log-lines", LogLines)

    def show_run(self, run_dir: Path) -> None:
        """Start over for `run_dir` (its lines arrive through `add`)."""
        self.run_dir, self.path, self.events, self._pending = Path(run_dir), None, [], []
        if self._ready and self.query("#log-lines"):
            self.lines.clear()
            self._show_events()
            self._title()

    def add(self, read: LogRead) -> None:
        # Kept for later until the lines widget is there: before this view's first mount (it
        # is built after the app's first frame) and while the app is tearing it down.
        if not self._ready or not self.query("#log-lines"):
            self._pending.append(read)
            return
        if read.restarted:
            self.lines.clear()
            self.path = read.path
        self.lines.append(read.lines)
        if read.events is not None:
            self.events = read.events
            self.lines.set_marks({e.line_number: e.severity for e in self.events})
            self._show_events()
        self._title()

    def _title(self) -> None:
        lines = self.lines
        if self.run_dir is None:
            text = "no run open"
        elif self.path is None:
            text = f"{self.run_dir}: no logs/*.log yet"
        else:
            try:
                shown = self.path.relative_to(self.run_dir)
            except ValueError:
                shown = self.path
            text = f"{self.run_dir}/{shown}   {len(lines.lines):,} lines, {len(self.events)} events"
            if not lines.filter.empty:
                text += f"   filter: {len(lines.shown):,} shown"
            if lines.filter.problem:
                text += f"   ({lines.filter.problem})"
        static = self.query_one("#log-title", Static)
        if str(static.content) != text:
            static.update(text)

    def _show_events(self) -> None:
        options = self.query_one("#log-events", OptionList)
        highlighted = options.highlighted
        options.clear_options()
        options.add_options(Option(event_text(e), id=str(i)) for i, e in enumerate(self.events))
        options.display = bool(self.events)
        if highlighted is not None and highlighted < len(self.events):
            options.highlighted = highlighted

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "log-filter":
            self.lines.set_filter(LogFilter.parse(event.value))
            self._title()
        elif event.input.id == "log-search":
            self.lines.set_search(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "log-search":
            self.action_next_match()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.go_to_event(self.events[int(event.option.id or 0)])

    def go_to_event(self, event: Event) -> None:
        if not self.lines.jump_to(event.line_number):
            self.query_one("#log-filter", Input).value = ""
            self.lines.set_filter(LogFilter())
            self.lines.jump_to(event.line_number)
        self.lines.focus()

    def go_to_last_error(self) -> None:
        """Jump to the first error event (a root cause usually comes before its consequences)."""
        errors = [e for e in self.events if e.severity == "error"]
        if errors:
            self.go_to_event(errors[0])

    def action_search(self) -> None:
        self.query_one("#log-search", Input).focus()

    def action_filter(self) -> None:
        self.query_one("#log-filter", Input).focus()

    def action_events_only(self) -> None:
        field = self.query_one("#log-filter", Input)
        words = field.value.split()
        field.value = " ".join(w for w in words if w != "events") if "events" in words else " ".join([*words, "events"])

    def action_next_match(self) -> None:
        if self.lines.next_match(1) is None and self.lines.search:
            self.notify(f"no line contains {self.lines.search!r}", severity="warning")

    def action_previous_match(self) -> None:
        self.lines.next_match(-1)

    def action_follow(self) -> None:
        self.lines.follow()

    def focus_main(self) -> None:
        self.lines.focus()
