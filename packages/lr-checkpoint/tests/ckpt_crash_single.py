"""SIGKILL a single-process save at every pause point (one torch import for all four).

    python ckpt_crash_single.py WORK_DIR

For each point, `WORK_DIR/<point>/checkpoints` gets a finished step 1; then a forked
child starts saving step 2 with LR_TEST_PAUSE_IN_SAVE=<point>, and once the child has
written its `.paused-<point>` marker this process kills it with SIGKILL. The reference
weights of step 1 go to `WORK_DIR/ref.safetensors`. Prints `KILLED <point>` for each.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import lr_checkpoint as lc  # noqa: E402
from ckpt_toy import make_model, make_optimizer, request, snapshot, train  # noqa: E402

POINTS = ("before_shards", "between_shards", "before_rename", "before_last")


def wait_for(marker: Path, child: int) -> None:
    deadline = time.monotonic() + 120
    while not marker.exists():
        finished, _ = os.waitpid(child, os.WNOHANG)
        if finished or time.monotonic() > deadline:
            raise SystemExit(f"the saver never paused at {marker.name}")
        time.sleep(0.05)


def kill_at(point: str, checkpoints: Path, model: object, optimizer: object) -> None:
    child = os.fork()
    if child == 0:
        os.environ["LR_TEST_PAUSE_IN_SAVE"] = point
        lc.save_checkpoint(checkpoints, 2, request(model, optimizer, 2))  # type: ignore[arg-type]
        os._exit(3)  # unreachable: the pause sleeps until killed
    wait_for(checkpoints / f".paused-{point}", child)
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    print(f"KILLED {point}", flush=True)


def main() -> None:
    work = Path(sys.argv[1])
    model = make_model(0)
    optimizer = make_optimizer(model)
    train(model, optimizer, 2, rank=0)
    snapshot(work / "ref.safetensors", model, optimizer, rank=0)
    for point in POINTS:
        lc.save_checkpoint(work / point / "checkpoints", 1, request(model, optimizer, 1))
    train(model, optimizer, 1, rank=0)
    for point in POINTS:
        kill_at(point, work / point / "checkpoints", model, optimizer)


if __name__ == "__main__":
    main()
