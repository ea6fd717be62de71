"""Shared pytest plugins for every test folder (import-mode=importlib).

Fixture modules live in tests/_support/; each is registered here once.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "tests"))

pytest_plugins = ["_support.procs", "_support.hub", "_support.data", "_support.runs"]
