"""`lr-engine train [--flags]`: the training entry point, single process or under torchrun;
`lr-engine eval [--flags]`: a policy rolled out in the demo task (one process, `_eval.py`).

Exit codes (the same on every rank, so a launcher's code says the same):
- 0: finished its --steps;
- 1: failed (a bug, a crashed peer, a full disk, ...; a traceback or the error);
- 2: a problem the user can fix (a flag, a value, a file; one clear message, no traceback,
  nothing written before the check);
- 3: stopped on request (SIGINT/SIGTERM) at an update boundary, the final checkpoint saved:
  the run can be resumed (the last line printed says how);
- 130: interrupted by a second signal, without a clean stop.
Order: parse flags, then the accelerate environment guard, then validation (the rules
that need no world size before torch is imported, then the launched world size), then
work. Every rank of a multi-process run ends through `parallel.dist.finish` (the
gloo-safe tear-down) or, on failure, `abort` (no collectives, so a failure anywhere ends
the whole job promptly instead of hanging).
"""

from __future__ import annotations

import os
import sys
import time
import traceback

from lr_config import VERSION_FLAG, ConfigError, apply_accelerate_env, did_you_mean, format_help, parse_train_config, validate, versions_text

from ._streams import guard_streams

EXIT_STOPPED = 3

USAGE = """usage: lr-engine train [--name=value ...]   (lr-engine train --help lists every flag)
       lr-engine launch [torchrun options] train [--name=value ...]   (torchrun, quietly, with lr's exit codes)
       lr-engine eval --policy.path=FOLDER_OR_REPO_ID [--name=value ...]   (success rate in the demo task)"""


_PEER_GRACE_S = 10.0


def _error(message: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"lr-engine: error: {message}", file=sys.stderr, flush=True)


def _config_error(message: str) -> None:
    """Say what to change once, from rank 0, and never lose it.

    Every rank checks the same flags and files, so rank 0 normally meets the same problem and
    prints it; its exit then makes the launcher stop the other ranks. Another rank must not exit
    first: a launcher that sees it exit stops rank 0, maybe before rank 0 printed anything (seen
    under load). So it waits; if it is still alive after the grace, the problem is its own, and it
    says so with its rank.
    """
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        _error(message)
        return
    time.sleep(_PEER_GRACE_S)
    print(f"lr-engine: error (rank {rank}): {message}", file=sys.stderr, flush=True)


def _command(argv: list[str]) -> list[str] | int:
    if VERSION_FLAG in argv[:2]:  # `lr-engine --version` or `lr-engine train --version`; --version=N is the schema field
        print(versions_text("lr-engine"))
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] == "launch":
        from ._launcher import launch

        return launch(argv[1:])
    if argv[0] == "eval":
        return _eval(argv[1:])
    if argv[0] != "train":
        _error(f"unknown command {argv[0]!r}{did_you_mean(argv[0], ['train', 'launch', 'eval'])}\n{USAGE}")
        return 2
    return argv[1:]


def _eval(flags: list[str]) -> int:
    """`lr-engine eval`: one process; exit 0, or 2 with one message for a flag or file to fix."""
    from lr_config import format_eval_help, parse_eval_config

    if "--help" in flags or "-h" in flags:
        print(format_eval_help())
        return 0
    try:
        cfg = parse_eval_config(flags)  # before torch is imported: a bad flag exits at once
        from ._eval import run_eval

        run_eval(cfg)
    except ConfigError as exc:
        _error(str(exc))
        return 2
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    return 0


def run(argv: list[str]) -> int:
    """Everything up to the end of training; returns the exit code (the caller exits)."""
    flags = _command(argv)
    if isinstance(flags, int):
        return flags
    try:
        if "--help" in flags or "-h" in flags:
            print(format_help())
            return 0
        from ._hub_models import resolve_policy_path_flag

        flags = resolve_policy_path_flag(flags)  # a Hub repo id is downloaded once, then read as a folder
        cfg, applied = apply_accelerate_env(parse_train_config(flags), os.environ)
        if applied and int(os.environ.get("RANK", "0")) == 0:
            print("accelerate's environment applied (its override is set): " + "; ".join(applied), flush=True)
        # Every rule that needs no world size, before torch is imported: a bad value exits
        # 2 in a fraction of a second; the launched world is checked in init_distributed.
        validate(cfg)
        from ._policies.registry import registry

        registry()  # every installed policy plugin is checked (and a broken one named) before anything starts
        if cfg.dry_run:
            from ._plan import dry_run

            return dry_run(cfg)
        from ._parallel.dist import init_distributed

        ctx = init_distributed(cfg)
        from ._train import train

        if train(cfg, ctx).stopped:
            return EXIT_STOPPED
    except ConfigError as exc:
        _config_error(str(exc))
        return 2
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except Exception as exc:
        traceback.print_exc()
        sys.stderr.flush()
        from ._launcher import record_failure

        record_failure(int(os.environ.get("RANK", "0")), exc)
        return 1
    return 0


def main(argv: list[str] | None = None) -> None:
    guard_streams()  # a reader of stdout/stderr that goes away (`| tee` killed by the same Ctrl+C) never fails the run
    code = run(sys.argv[1:] if argv is None else argv)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        from ._parallel.dist import abort, finish

        if code == 0:
            finish(0)
        abort(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
