"""The switch and the one-time notice of the readers that parse torch's private formats.

Two readers exist only for speed, and both read what `torch.save` writes inside a DCP shard
file (a zip archive, its `data.pkl`) instead of asking torch: resume's direct reader
(`_formats.dcp.direct`, tensor bytes straight into their destination) and the converter's
byte-range copy (`_formats.dcp.stream`, through `_formats.torch_save.locate`). Each has a
fallback through torch's public API: DCP's own `FileSystemReader`, and a whole-tensor DCP
load. A record such a reader does not recognise (a torch version that lays its archives out
otherwise) goes to the fallback, which is slower and gives the same tensors; the process
says so once, on stderr, and goes on.

`LR_CHECKPOINT_FAST_PATHS=0` switches both readers off: every read then takes the fallback.
The tests run resume, convert and verify that way too, so the fallback is exercised by CI
and not only where a new torch makes it needed.

The restricted unpickler of DCP's `.metadata` (`_formats.dcp.metadata`) is not a fast path
but a guard: it has no switch and never falls back to `pickle`.
"""

from __future__ import annotations

import os
import sys
import threading
from importlib import metadata

__all__ = ["FAST_PATHS_ENV", "enabled", "fell_back"]

FAST_PATHS_ENV = "LR_CHECKPOINT_FAST_PATHS"

_said = False
_lock = threading.Lock()


def enabled() -> bool:
    """False when `LR_CHECKPOINT_FAST_PATHS` is 0, false, no or off (read at each call)."""
    return os.environ.get(FAST_PATHS_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def fell_back(where: object) -> None:
    """A fast reader met a record it does not recognise in `where`: say so once per process."""
    global _said
    with _lock:
        if _said:
            return
        _said = True
    print(
        f"lr-checkpoint: note: {where} holds a tensor record that lr's fast reader does not recognise (torch "
        f"{_torch_version()}); it and any other such record are read through torch's DCP reader, which is slower and "
        f"gives the same tensors. Set {FAST_PATHS_ENV}=0 to always read that way.",
        file=sys.stderr,
        flush=True,
    )


def _torch_version() -> str:
    try:
        return metadata.version("torch")  # without importing torch (the converter does not)
    except metadata.PackageNotFoundError:
        return "not installed"
