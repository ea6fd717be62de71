"""lr-tui: a Textual app to build launches, watch runs and browse checkpoints. Never imports torch.

Public API: `LrApp` (the app; `LrApp().run()`), `main(argv)` (the `lr-tui` entry point).
Both are imported on first use, so `import lr_tui` stays cheap. The underscore modules are
implementation.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["LrApp", "main"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("._app", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
