"""`Table` (every table of the app): the widths it measures reach the screen even when a
frame was drawn between an update and the idle pass that measures it."""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult
from textual.geometry import Region

from lr_tui._widgets.table import Table

pytestmark = pytest.mark.asyncio


class _OneTable(App[None]):
    def compose(self) -> ComposeResult:
        table = Table(id="t")
        table.add_columns("run", "status")
        yield table


def _row(table: Table) -> str:
    return table.render_lines(Region(0, 0, table.size.width, 2))[1].text.rstrip()


async def test_a_frame_drawn_before_the_idle_pass_does_not_keep_the_old_widths() -> None:
    """Textual's DataTable caches that frame's lines, cut at the old widths ('runnin'), and
    shows them until its next update (checked: it does, with DataTable in place of Table)."""
    app = _OneTable()
    async with app.run_test(size=(60, 8)) as pilot:
        table = app.query_one("#t", Table)
        table.add_row("sample_run", "", key="r")
        await pilot.pause()
        await pilot.pause()
        table.update_cell("r", list(table.columns)[1], "finished", update_width=True)
        assert _row(table) == " sample_run  finish"  # drawn before the idle pass: the header's width
        await pilot.pause()
        await pilot.pause()
        assert _row(table) == " sample_run  finished"
