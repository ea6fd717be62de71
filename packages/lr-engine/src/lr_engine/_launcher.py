"""`lr-engine launch [torchrun options] train [flags]`: torchrun, quietly, with lr's exit codes.

Plain `torchrun ... -m lr_engine.cli train` keeps working; this command runs the same launcher
(torch's own `torch.distributed.run`, every torchrun option accepted) so that the last thing
a person sees is lr's own message, and the exit code says how the run ended:

- The train flags are checked here first, for the world the options describe (processes per
  node x nodes), before any worker starts: a bad flag or a topology that does not fit exits 2
  with lr's one message and no launcher traceback.
- SIGINT and SIGTERM (Ctrl+C, a scheduler's preemption) are passed to the workers, which stop
  at their next update and save; the launcher waits for them instead of killing them after
  torchrun's shutdown timeout. A second signal is passed on too (the workers then stop at once).
- torchrun's own log lines and its failure table are kept quiet (unless LOGLEVEL is set); when
  workers fail, one line at the end names the rank that failed first and its exit code.

Exit codes are the workers' (see `lr_engine.cli`): 0 finished, 1 failed, 2 a setting to fix,
3 stopped on request with the final checkpoint saved, 130 interrupted by a second signal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from lr_config import ConfigError, TrainConfig, apply_accelerate_env, parse_train_config, validate

USAGE = "usage: lr-engine launch [torchrun options, e.g. --nproc-per-node=2] train [--name=value ...]"
LAUNCH_COMMAND_ENV = "LR_LAUNCH_COMMAND"
"""Set for the workers: the launch prefix a worker prints in its resume command."""
FAILURES_ENV = "LR_LAUNCH_FAILURES"
"""Set for the workers: the folder where a failing worker notes when and why (`record_failure`)."""


def _split(argv: list[str]) -> tuple[list[str], list[str]] | None:
    """(torchrun options, train flags), or None without a `train` command."""
    if "train" not in argv:
        return None
    i = argv.index("train")
    return argv[:i], argv[i + 1 :]


def _parse_launcher(options: list[str], train_flags: list[str]) -> Any:
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.prog = "lr-engine launch"
    return parser.parse_args([*options, "-m", "lr_engine.cli", "train", *train_flags])


def _fixed_world(args: Any) -> tuple[int, int] | None:
    """(world size, nodes) when the options fix them (an elastic `--nnodes=1:4`, or
    `--nproc-per-node=gpu`, leaves it to the workers' own check)."""
    low, _, high = str(args.nnodes).partition(":")
    nproc = str(args.nproc_per_node)
    if not (low.isdigit() and nproc.isdigit()) or high not in ("", low):
        return None
    return int(low) * int(nproc), int(low)


def _check(train_flags: list[str], args: Any) -> TrainConfig:
    """What the workers would refuse at start-up, checked before they start (ConfigError)."""
    cfg, _ = apply_accelerate_env(parse_train_config(train_flags), os.environ)  # the workers print what applied
    validate(cfg)
    world = _fixed_world(args)
    if world is not None:
        from ._parallel.dist import validate_for_world

        validate_for_world(cfg, *world)
    return cfg


def _children() -> list[int]:
    """This process's child processes (torchrun's workers: each leads its own session)."""
    pids: list[int] = []
    for task in Path("/proc/self/task").iterdir():
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return pids


def _forward(signum: int, frame: Any) -> None:
    for pid in _children():
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _quiet_torchrun(args: Any, quiet: bool) -> None:
    """torchrun's own log lines off (`quiet`: the user did not set LOGLEVEL); SIGINT/SIGTERM forwarded."""
    if quiet:  # its get_logger loggers took LOGLEVEL at import; the others inherit from here
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    # torchrun would turn SIGINT/SIGTERM into an exception, then kill the workers after its
    # shutdown timeout, maybe in the middle of their final checkpoint; they are forwarded instead.
    args.signals_to_handle = "SIGHUP,SIGQUIT"
    signal.signal(signal.SIGINT, _forward)
    signal.signal(signal.SIGTERM, _forward)


def exit_code(codes: list[int]) -> int:
    """The launch's exit code from the failed workers' codes (negative: killed by a signal).

    torchrun stops the other workers with SIGTERM once one exits non-zero, so those show -15:
    a stop is a stop when every worker that ended by itself ended with 3."""
    own = [c for c in codes if c != -signal.SIGTERM] or codes
    if 2 in own:
        return 2
    for code in (3, 130):
        if all(c == code for c in own):
            return code
    return 1


def record_failure(rank: int, exc: BaseException) -> None:
    """Worker side: note when this rank failed and why, for the launcher's last line (see `_report`)."""
    folder = os.environ.get(FAILURES_ENV)
    if folder:
        with contextlib.suppress(OSError):
            Path(folder, f"rank{rank}").write_text(f"{time.time_ns()} {type(exc).__name__}: {exc}".splitlines()[0])


def _first_failure(folder: Path, failures: dict[int, Any]) -> tuple[int, str]:
    """(rank, what) of the worker that failed first: the earliest record a worker wrote as it
    failed (a peer's failure makes the others fail a moment later, in a collective), else the
    first to end in torchrun's own (per-second) record."""
    noted = []
    for path in folder.glob("rank*"):
        with contextlib.suppress(OSError, ValueError):
            when, _, what = path.read_text().partition(" ")
            noted.append((int(when), int(path.name.removeprefix("rank")), what))
    if noted:
        _, rank, what = min(noted)
        return rank, what
    rank, failure = min(failures.items(), key=lambda item: (item[1].timestamp, item[0]))
    code = failure.exitcode
    return rank, (f"killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else f"exit code {code}")


def _report(folder: Path, failures: dict[int, Any]) -> None:
    rank, what = _first_failure(folder, failures)
    print(f"lr-engine launch: rank {rank} failed first ({what}); its error is above, and the other ranks were stopped", file=sys.stderr)


def launch(argv: list[str]) -> int:
    """Run `argv` (`[torchrun options] train [flags]`); returns the exit code."""
    split = _split(argv)
    if split is None or not argv:
        print(USAGE, file=sys.stderr if argv else sys.stdout)
        return 2 if argv else 0
    options, train_flags = split
    quiet = "LOGLEVEL" not in os.environ
    os.environ.setdefault("LOGLEVEL", "CRITICAL")  # torchrun's loggers read it when its modules are imported
    if "--help" in train_flags or "-h" in train_flags:
        from lr_config import format_help

        print(format_help())
        return 0
    try:
        args = _parse_launcher(options, train_flags)
        cfg = _check(train_flags, args)
        if cfg.dry_run:  # the plan for the world these options launch, without launching it
            from ._plan import dry_run

            world = _fixed_world(args)
            return dry_run(cfg if world is None or cfg.world_size is not None else replace(cfg, world_size=world[0]))
    except ConfigError as exc:
        print(f"lr-engine: error: {exc}", file=sys.stderr)
        return 2
    os.environ[LAUNCH_COMMAND_ENV] = shlex.join(["lr-engine", "launch", *options])
    failures = Path(tempfile.mkdtemp(prefix="lr-launch-"))
    os.environ[FAILURES_ENV] = str(failures)
    try:
        return _run(args, quiet, failures)
    finally:
        shutil.rmtree(failures, ignore_errors=True)


def _run(args: Any, quiet: bool, failures: Path) -> int:
    _quiet_torchrun(args, quiet)
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import run

    try:
        run(args)
    except ChildFailedError as exc:
        code = exit_code([f.exitcode for f in exc.failures.values()])
        if code == 1:
            _report(failures, exc.failures)
        return code
    except SignalException as exc:  # SIGHUP or SIGQUIT: torchrun stopped the workers
        print(f"lr-engine launch: {exc}; the workers were stopped", file=sys.stderr)
        return 128 + int(exc.sigval)
    return 0
