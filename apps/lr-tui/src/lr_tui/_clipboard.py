"""Copying to the clipboard, and saying so only when it can have worked.

Textual's `App.copy_to_clipboard` writes the text to the terminal as an OSC 52 sequence; the
terminal puts it on the clipboard, or ignores it without a word. `copy_text` writes it and
then says what happened: "copied" where the sequence can reach a clipboard, else that it
could not, why, and that the text is on the screen to select by hand. It cannot when there
is no terminal (a headless app, output that is not a TTY), in macOS Terminal (no OSC 52), in
GNU screen (it does not pass the sequence on), or in tmux unless `set-clipboard` is `on`
(its default, `external`, drops an application's clipboard writes).
"""

from __future__ import annotations

import os
import subprocess
import sys

from textual.app import App

__all__ = ["clipboard_problem", "copy_text"]


def _tmux_passes_clipboard() -> bool | None:
    """Whether the tmux around us passes OSC 52 on (`set-clipboard on`); None when unknown."""
    try:
        done = subprocess.run(["tmux", "show-options", "-sv", "set-clipboard"], capture_output=True, text=True, timeout=1)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() == "on" if done.returncode == 0 else None


def clipboard_problem(app: App[object]) -> str | None:
    """Why an OSC 52 clipboard write from `app` cannot reach a clipboard; None when it can."""
    if app.is_headless:
        return "there is no terminal (a headless app)"
    stream = sys.__stderr__  # where Textual's driver writes
    if stream is None or not stream.isatty():
        return "the app's output is not a terminal"
    if os.environ.get("TERM_PROGRAM") == "Apple_Terminal":
        return "macOS Terminal ignores clipboard writes (OSC 52); iTerm2, kitty, WezTerm and most others take them"
    if os.environ.get("TERM") in ("dumb", "linux"):
        return f"this terminal (TERM={os.environ['TERM']}) has no clipboard"
    if os.environ.get("STY"):
        return "GNU screen does not pass clipboard writes (OSC 52) on"
    if os.environ.get("TMUX") and _tmux_passes_clipboard() is False:
        return "tmux drops clipboard writes (OSC 52) unless `tmux set -s set-clipboard on`"
    return None


def copy_text(app: App[object], text: str, what: str, where: str) -> bool:
    """Copy `text` (`what`, e.g. "the launch command") and notify; `where` names the place on the
    screen it is shown, for copying by hand. True when it can have reached the clipboard."""
    app.copy_to_clipboard(text)
    problem = clipboard_problem(app)
    if problem is None:
        app.notify(f"Copied {what} to the clipboard.")
        return True
    app.notify(f"Could not copy {what}: {problem}. It is shown in {where}: select it (shift+drag in most terminals) to copy by hand.", severity="warning", timeout=10)
    return False
