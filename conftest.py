"""Shared pytest plugins for every test folder (import-mode=importlib).

Fixture modules live in tests/_support/; each is registered here once.

With PYTHONDONTWRITEBYTECODE=1 (set on the CI machines) no process caches bytecode, so every
process the suite starts (hundreds: torchrun, its workers, the CLIs) compiled torch from
source again: `import torch` plus DCP took about 10 s of CPU instead of 4. The session
compiles the environment's packages once (`compileall`, a no-op once they are compiled), and
lr's own sources, which are installed editable: importing lr-engine's training path after torch
took 0.52-0.64 s without their .pyc and 0.2 s with it, in each process the suite starts.

The suite runs on two pytest-xdist workers (`-n 2 --dist loadgroup` in pyproject.toml). Tests
marked `multiprocess` start gloo jobs of 2-4 ranks, which already keep both cores of a CI
machine busy: they form one xdist group and run one after another on one worker, while the
other worker runs the single-process tests (Textual pilots, config and CLI tests), which leave a
core idle. `-n 0` runs everything in one process.

When the collected tests include tests/test_typing.py and no workers run them, its
`mypy --strict` run starts as collection ends, at the lowest CPU priority
(`_support/typing_run.py`): its 70-80 s of one core overlap the rest of the suite instead of
adding to it. Under xdist every worker collects every test, so the run starts when the test
asks for it instead.
"""

import compileall
import sys
import sysconfig
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "tests"))

from _support import typing_run  # noqa: E402

pytest_plugins = ["_support.procs", "_support.hub", "_support.data", "_support.runs"]


def _is_xdist_worker(config) -> bool:  # type: ignore[no-untyped-def]
    return hasattr(config, "workerinput")


def _runs_with_workers(config) -> bool:  # type: ignore[no-untyped-def]
    return _is_xdist_worker(config) or getattr(config.option, "numprocesses", None) not in (None, 0)


def pytest_sessionstart(session) -> None:  # type: ignore[no-untyped-def]
    # the controller compiles before it starts its workers; the workers import what it compiled
    if not sys.flags.dont_write_bytecode or _is_xdist_worker(session.config):
        return
    # lr's own sources are installed editable (not in purelib): every process the suite starts
    # imports them, so they are compiled once too (a no-op for a file whose .pyc is current)
    root = Path(__file__).parent
    for src in [*sorted(root.glob("packages/*/src")), *sorted(root.glob("apps/*/src")), *sorted(root.glob("examples/*/src"))]:
        compileall.compile_dir(str(src), quiet=2, workers=2)
    packages = Path(sysconfig.get_paths()["purelib"])
    installed = "\n".join(sorted(p.name for p in packages.glob("*.dist-info")))
    marker = packages / ".lr-compiled-for"  # what was installed when it was last compiled
    if marker.exists() and marker.read_text() == installed:
        return
    compileall.compile_dir(str(packages), quiet=2, workers=2)
    marker.write_text(installed)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:  # type: ignore[no-untyped-def]
    """Multi-process tests share one xdist group: one runs at a time, beside single-process ones."""
    group = pytest.mark.xdist_group("multiprocess")
    for item in items:
        if item.get_closest_marker("multiprocess") is not None:
            item.add_marker(group)


def pytest_collection_finish(session) -> None:  # type: ignore[no-untyped-def]
    """mypy for tests/test_typing.py starts now, at low priority, on the CPU the suite leaves idle."""
    if _runs_with_workers(session.config):
        return
    if any(item.nodeid.startswith("tests/test_typing.py") for item in session.items):
        typing_run.start()


def pytest_sessionfinish(session, exitstatus) -> None:  # type: ignore[no-untyped-def]
    typing_run.stop()
