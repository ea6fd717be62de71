"""`Table`: a DataTable that redraws its rows once it has measured new column widths.

Textual's DataTable measures updated cells when the app is idle, but caches the lines it
renders by row and update count, not by column widths. A frame drawn between an update and
that idle (a busy machine, a poll landing just before a repaint) caches the rows at the old
widths, and the measured widths never reach the screen until the next update: the run list
showed `runnin` for `running`, and a finished run, whose table no longer changes, kept its
values cut to their column headers. After its idle pass, `Table` drops those cached lines
when a column width changed, and redraws.
"""

from __future__ import annotations

from textual import events
from textual.widgets import DataTable

__all__ = ["Table"]


class Table(DataTable[str]):
    def _widths(self) -> list[int]:
        return [column.content_width for column in self.columns.values()]

    async def _on_idle(self, event: events.Idle) -> None:
        before = self._widths()
        await super()._on_idle(event)
        if self._widths() != before:
            self._clear_caches()
            self.refresh()
