"""Python's garbage collector stays out of a save and a load (`_ranks.collector_paused`).

A full collection of a process that imported torch takes a fifth of a second on the
benchmark machine, and inside a collective save or load every other rank waits for the
rank it hits. The collector is made to run at almost every allocation here, so that
without the pause collections would start inside the calls for certain; a collection is
counted as inside when the frame that triggered it runs within lr_checkpoint's save or
load.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import lr_checkpoint as lc
from ckpt_toy import make_model, make_optimizer, request, train

BODIES = {"_save_checkpoint", "_load_model_and_optimizer"}


def _inside_lr_checkpoint(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_name in BODIES and str(frame.f_globals.get("__name__", "")).startswith("lr_checkpoint"):
            return True
        frame = frame.f_back
    return False


@contextmanager
def collections() -> Iterator[list[bool]]:
    """One entry per collection that starts in the block, whether it started inside a save or
    a load; the youngest generation is collected at almost every allocation meanwhile (the
    older ones rarely: a full collection takes a fifth of a second)."""
    seen: list[bool] = []

    def started(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(_inside_lr_checkpoint(sys._getframe(1)))

    threshold = gc.get_threshold()
    gc.callbacks.append(started)
    gc.set_threshold(1, 1000, 1000)
    try:
        yield seen
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(started)


def _save_and_load(tmp_path: Path) -> Callable[[], None]:
    model = make_model(3)
    optimizer = make_optimizer(model)
    train(model, optimizer, 1, rank=0)

    def run() -> None:
        step = lc.save_checkpoint(tmp_path / "checkpoints", 1, request(model, optimizer, 1))
        lc.load_model_and_optimizer(step, model, optimizer)

    return run


def test_no_collection_starts_inside_a_save_or_a_load(tmp_path: Path) -> None:
    run = _save_and_load(tmp_path)
    assert gc.isenabled()
    with collections() as seen:
        run()
        assert gc.isenabled()  # on again after each
        _ = [[] for _ in range(10)]  # control: the collector does run, at almost every allocation
    assert seen and not any(seen)


def test_a_collector_the_caller_turned_off_stays_off(tmp_path: Path) -> None:
    run = _save_and_load(tmp_path)
    gc.disable()
    try:
        with collections() as seen:
            run()
        assert not gc.isenabled() and not seen
    finally:
        gc.enable()


def test_the_collector_is_on_again_after_a_failed_load(tmp_path: Path) -> None:
    model = make_model(3)
    with pytest.raises(lc.CheckpointError):
        lc.load_model_and_optimizer(tmp_path / "missing", model, make_optimizer(model))
    assert gc.isenabled()
