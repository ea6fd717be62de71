"""lr-tui test setup: makes the helpers in tui_support importable from the tests."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
