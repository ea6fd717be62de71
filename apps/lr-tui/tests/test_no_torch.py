"""The TUI never imports torch: build the app, visit every view, then look at sys.modules."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

VISIT_EVERY_VIEW = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from lr_tui._app import LrApp

    async def main():
        app = LrApp(Path(sys.argv[1]), plan_runner=None, poll_interval=0.05)
        async with app.run_test(size=(100, 30)) as pilot:
            while not app.checkpoints_view.is_mounted:
                await pilot.pause(0.05)
            for key in ("1", "2", "3", "down", "4", "5", "question_mark", "escape"):
                await pilot.press(key)
                await pilot.pause()
            assert app.checkpoints_view.checkpoints, "the checkpoints view read the sample"
            assert app.log_view.lines.lines and app.hardware_view.sample is not None, "logs and hardware were read"

    asyncio.run(main())
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "numpy", "safetensors"))
    print("heavy modules:", heavy)
    sys.exit(1 if heavy else 0)
    """
)


def test_the_app_never_imports_torch():
    sample = Path(__file__).parent / "sample_run"
    done = subprocess.run([sys.executable, "-c", VISIT_EVERY_VIEW, str(sample)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "heavy modules: []" in done.stdout
