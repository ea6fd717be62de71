"""A placeholder that builds its widget only after the first frame.

Like Textual's `Lazy`, which mounts a widget after the first refresh, but `Lazy` needs the
widget itself at compose time, so its module is imported before the first frame. `Deferred`
takes a function that builds it: the hidden views' modules (~60 ms) load after the user sees
the app.
"""

from __future__ import annotations

from collections.abc import Callable

from textual.widget import Widget

__all__ = ["Deferred"]


class Deferred(Widget):
    DEFAULT_CSS = """
    Deferred {
        display: none;
    }
    """

    def __init__(self, build: Callable[[], Widget]) -> None:
        super().__init__()
        self._build = build

    def on_mount(self) -> None:
        self.call_after_refresh(self._replace)

    async def _replace(self) -> None:
        parent = self.parent
        # the placeholder or its parent may be gone by the time the frame is drawn (a chart
        # replaced, the app quitting): then nothing is built, where mounting would raise
        if not (isinstance(parent, Widget) and parent.is_attached and self.is_attached):
            return
        await parent.mount(self._build(), after=self)
        await self.remove()
