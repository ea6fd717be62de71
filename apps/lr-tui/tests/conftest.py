"""lr-tui test setup: makes the helpers in tui_support and real_runs importable from the tests."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _no_default_run_roots(monkeypatch: pytest.MonkeyPatch) -> None:
    """An app made without `runs=` lists no `outputs/train` of the working folder (the developer's
    runs): only the tests that pass `runs=` list runs found on disk."""
    from lr_tui import _run_list

    monkeypatch.setattr(_run_list, "DEFAULT_RUN_ROOTS", ())


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo dataset with 4 episodes (made by lr-engine in a subprocess)."""
    from real_runs import make_tiny_dataset

    return make_tiny_dataset(tmp_path_factory.mktemp("ds") / "demo")
