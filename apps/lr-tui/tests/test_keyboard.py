"""Keyboard-only use: fields, leaving a field, view keys, help and the command palette."""

from __future__ import annotations

from pathlib import Path

import pytest
from tui_support import app_ready, wait_until

from lr_tui._app import LrApp
from lr_tui._screens.help import HelpScreen
from lr_tui._widgets.choice import Choice, ChoiceMenu

pytestmark = pytest.mark.asyncio


def accelerate_launch(preview: str) -> bool:
    """The preview runs `accelerate launch` (this environment's accelerate, by its path)."""
    program, _, rest = preview.partition(" ")
    return Path(program).name == "accelerate" and rest.startswith("launch")


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


async def test_a_choice_steps_with_arrows_and_picks_from_its_menu_by_key_and_click():
    app = LrApp(plan_runner=None)
    async with app.run_test(size=(80, 24)) as pilot:
        await app_ready(pilot)
        view = app.launch_view
        await pilot.press("tab")  # the launcher choice
        choice = app.query_one("#field-launcher", Choice)
        assert app.focused is choice and view.rows["launcher"].value == "torchrun"
        await pilot.press("right")
        await wait_until(pilot, lambda: accelerate_launch(view.plan.preview), what="the preview after right")
        await pilot.press("left", "left")  # wraps around to the last option
        assert choice.value == "slurm"
        await pilot.press("right")
        assert choice.value == "torchrun"

        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, ChoiceMenu)
        await pilot.press("down", "enter")
        await pilot.pause()
        assert not isinstance(app.screen, ChoiceMenu) and app.focused is choice
        assert choice.value == "accelerate"
        await wait_until(pilot, lambda: accelerate_launch(view.plan.preview), what="the preview after the menu")

        await pilot.press("space")
        await pilot.pause()
        assert isinstance(app.screen, ChoiceMenu)
        await pilot.press("down", "escape")  # closes without choosing
        await pilot.pause()
        assert not isinstance(app.screen, ChoiceMenu) and choice.value == "accelerate"

        await pilot.click("#field-policy_type")
        await pilot.pause()
        assert isinstance(app.screen, ChoiceMenu)
        await pilot.click(offset=(0, 0))  # outside the menu
        await pilot.pause()
        assert not isinstance(app.screen, ChoiceMenu)
        assert app.focused is app.query_one("#field-policy_type") and view.rows["policy_type"].value == ""  # the demo preset, unchanged
