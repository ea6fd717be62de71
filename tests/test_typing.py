"""`mypy --strict` passes on lr-checkpoint and lr-publish (lr-config checks itself in its own
tests). One invocation over both, so torch's stubs are analysed once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_strict_on_checkpoint_and_publish() -> None:
    sources = [str(ROOT / "packages" / name / "src") for name in ("lr-checkpoint", "lr-publish")]
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", *sources], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "Success: no issues found" in result.stdout
