"""Keyboard-only use: fields, leaving a field, view keys, help and the command palette."""

from __future__ import annotations

import pytest
from tui_support import app_ready, wait_until

from lr_tui._app import LrApp
from lr_tui._screens.help import HelpScreen

pytestmark = pytest.mark.asyncio


async def test_tab_into_the_form_escape_out_and_switch_views_by_key():
    app = LrApp(plan_runner=None)
    async with app.run_test(size=(80, 24)) as pilot:
        await app_ready(pilot)
        assert app.focused is app.query_one("#launch-form")
        await pilot.press("tab", "tab")  # launcher select, then nodes
        assert app.focused is app.query_one("#field-nnodes")
        await pilot.press("backspace", "2")  # typing digits in a field does not switch views
        assert app.query_one("#views").active == "launch"
        assert app.launch_view.rows["nnodes"].value == "2"
        await pilot.press("escape", "3")
        assert app.query_one("#views").active == "checkpoints"
        await pilot.pause()
        assert app.focused is app.query_one("#ckpt-table")
        await pilot.press("2")
        await pilot.pause()
        assert app.query_one("#views").active == "monitor" and app.focused is app.query_one("#runs")
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("1")
        await pilot.pause()
        assert app.query_one("#views").active == "launch" and app.focused is app.query_one("#launch-form")


async def test_command_palette_lists_the_views():
    app = LrApp(plan_runner=None)
    async with app.run_test(size=(100, 30)) as pilot:
        await app_ready(pilot)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"Checkpoints view")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.query_one("#views").active == "checkpoints", what="the palette command")
