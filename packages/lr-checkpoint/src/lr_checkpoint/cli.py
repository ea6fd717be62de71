"""`lr-checkpoint`: convert, inspect and verify checkpoints (one process, no GPU).

    lr-checkpoint convert DIR [--dtype=fp32|bf16|fp16] [--overwrite=true] [--delete_dcp=true]
                          [--push_to_hub=user/name [--private=true]]
    lr-checkpoint inspect DIR [--json]
    lr-checkpoint verify DIR

Exit codes: 0 success; 1 verify (or inspect) found problems; 2 bad input (unknown command
or flag, missing folder, not a checkpoint, a refused overwrite, a convert output that cannot
be written: a read-only folder, a full disk): one paragraph on stderr, no traceback, nothing
written (convert writes under a temporary name that a failure removes). torch is imported
only by the commands that read tensors.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lr_config import VERSION_FLAG, ConfigError, check_repo_id, did_you_mean, split_flags, versions_text
from lr_config.layout import CHECKPOINTS, LAST, MODEL_WEIGHTS, PRETRAINED, StepFiles, resolve_step_dir

from ._inspect import inspect_checkpoint

__all__ = ["main"]

PROG = "lr-checkpoint"


@dataclass(frozen=True)
class Command:
    """One subcommand: its flags (name -> help), whether it takes a DIR argument, its runner."""

    summary: str
    flags: dict[str, str]
    run: Callable[[dict[str, str]], int]
    positional_dir: bool = False


def _bool(flags: dict[str, str], name: str) -> bool:
    value = flags.get(name, "false").lower()
    if value not in ("true", "false"):
        raise ConfigError(f"--{name}: expected true or false, got {flags[name]!r}")
    return value == "true"


def _dir(flags: dict[str, str]) -> Path:
    if "checkpoint_dir" not in flags or not flags["checkpoint_dir"]:
        raise ConfigError(f"missing the checkpoint folder: pass --checkpoint_dir=DIR (a step folder, its {PRETRAINED}/, or {CHECKPOINTS}/{LAST})")
    return Path(flags["checkpoint_dir"])


def _publish_argv(step_dir: Path, flags: dict[str, str]) -> list[str] | None:
    """The lr-publish command for --push_to_hub, checked before any conversion work.

    lr-checkpoint does not import lr-publish (imports point the other way): the push runs
    the lr-publish CLI, which must be installed beside it.
    """
    repo_id = flags.get("push_to_hub")
    if repo_id is None:
        if "private" in flags:
            raise ConfigError("--private: only meaningful with --push_to_hub=user/name")
        return None
    check_repo_id(repo_id, flag="--push_to_hub")
    if importlib.util.find_spec("lr_publish") is None:
        raise ConfigError("--push_to_hub: needs the lr-publish package (pip install lr-publish), which publishes the converted checkpoint")
    argv = [sys.executable, "-m", "lr_publish.cli", f"--checkpoint_dir={step_dir}", f"--repo_id={repo_id}"]
    if _bool(flags, "private"):
        argv.append("--private=true")
    return argv


def _identity(path: Path) -> tuple[int, int, int] | None:
    """(inode, mtime, size) of `path`, None when absent: tells whether a rename replaced it."""
    try:
        st = os.stat(path)
    except OSError:  # absent (or not even stat-able: then it cannot have been replaced either)
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _convert_io_error(exc: OSError, files: StepFiles, before: tuple[int, int, int] | None) -> ConfigError:
    """One paragraph for an OSError during convert: what could not be read or written, and what now."""
    reason = exc.strerror or type(exc).__name__
    named = [Path(os.fsdecode(n)) for n in (exc.filename, exc.filename2) if n is not None]
    model = files.model
    if _identity(model) == before:  # not renamed into place: the temporary file was removed
        shard = next((p for p in named if files.model_dcp in p.parents), None)
        if shard is not None:
            return ConfigError(f"cannot read {shard} ({reason}); nothing was written: make the DCP shards readable, "
                               "then convert again")
        kept = f"the existing {model.name} is unchanged" if before is not None else "nothing was written"
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            fix = f"free space on the disk of {model.parent} (or copy the checkpoint where there is room)"
        elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            fix = f"make {model.parent} writable (or copy the checkpoint where you can write)"
        else:
            fix = f"make {model.parent} writable, with free space on its disk"
        return ConfigError(
            f"cannot write {model} ({reason}); {kept} (the partial file, if any, was removed): {fix}, "
            "then run the same command again"
        )
    where = f": {named[0]}" if named else ""
    return ConfigError(
        f"{model} was written, but a later step failed ({reason}{where}); the new file is complete, but "
        f"checksums.json may not list it yet and, with --delete_dcp, some DCP shards may remain: run "
        f"`lr-checkpoint verify {files.root}` to see what is left, fix the cause, then convert again with --overwrite=true"
    )


def _run_convert(flags: dict[str, str]) -> int:
    step_dir = resolve_step_dir(_dir(flags))
    dtype, overwrite, delete_dcp = flags.get("dtype", "fp32"), _bool(flags, "overwrite"), _bool(flags, "delete_dcp")
    files = StepFiles(step_dir)
    from ._convert import check_convert_request, convert_checkpoint  # numpy: only for convert

    check_convert_request(files, dtype, overwrite, delete_dcp)
    publish = _publish_argv(step_dir, flags)

    before = _identity(files.model)
    try:
        path = convert_checkpoint(step_dir, dtype=dtype, overwrite=overwrite, delete_dcp=delete_dcp)
    except OSError as exc:
        raise _convert_io_error(exc, files, before) from None
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)", flush=True)
    if publish is None:
        return 0
    return subprocess.run(publish).returncode


def _format_inspect(report: dict[str, Any]) -> str:
    topo = report["topology"] or {}
    lines = [
        f"checkpoint  {report['path']}",
        f"step        {report['step']}   format {report['format']}   precision {report['precision']}",
        f"topology    {topo.get('layout')} (dp_replicate={topo.get('dp_replicate')} dp_shard={topo.get('dp_shard')} world={topo.get('world_size')})",
    ]
    for part in ("model", "optimizer"):
        for source in report[part]:
            lines.append(f"{part:<11} {source['path']}: {source['tensors']} tensors, {source['bytes'] / 1e6:.2f} MB ({source['kind']})")
    lines.append(f"files       {len(report['files'])} files, {report['total_bytes'] / 1e6:.2f} MB")
    lines += [f"  {f['bytes']:>12}  {f['path']}" for f in report["files"]]
    lines += [f"PROBLEM: {p}" for p in report["problems"]]
    return "\n".join(lines)


def _run_inspect(flags: dict[str, str]) -> int:
    report = inspect_checkpoint(_dir(flags))
    print(json.dumps(report, indent=2) if _bool(flags, "json") else _format_inspect(report))
    return 1 if report["problems"] else 0


def _run_verify(flags: dict[str, str]) -> int:
    step_dir = resolve_step_dir(_dir(flags))  # a path that is no checkpoint is bad input (exit 2)
    from ._verify import verify_checkpoint  # imports torch

    problems = verify_checkpoint(step_dir)
    for problem in problems:
        print(f"PROBLEM: {problem}")
    print(f"{len(problems)} problem(s) in {step_dir}" if problems else f"OK {step_dir}")
    return 1 if problems else 0


_DIR_HELP = f"Step folder, its {PRETRAINED}/, {CHECKPOINTS}/{LAST} or a {CHECKPOINTS}/ folder."
COMMANDS: dict[str, Command] = {
    "convert": Command(
        f"Merge DCP model shards into {PRETRAINED}/{MODEL_WEIGHTS} (streaming).",
        {
            "checkpoint_dir": _DIR_HELP,
            "dtype": "fp32 (default), bf16 or fp16 for floating tensors.",
            "overwrite": "true to replace an existing model.safetensors.",
            "delete_dcp": "true to delete the DCP model shards once the new file is verified.",
            "push_to_hub": "user/name: publish the converted checkpoint with lr-publish afterwards.",
            "private": "true to publish to a private repo (with --push_to_hub; an existing public repo is refused).",
        },
        _run_convert,
        positional_dir=True,
    ),
    "inspect": Command("Describe a checkpoint from its headers.", {"checkpoint_dir": _DIR_HELP, "json": "true for JSON output."}, _run_inspect, positional_dir=True),
    "verify": Command("Check every file is present, complete and readable.", {"checkpoint_dir": _DIR_HELP}, _run_verify, positional_dir=True),
}


def usage() -> str:
    lines = [f"usage: {PROG} COMMAND [DIR] [--flag=value ...]", "", "commands:"]
    for name, command in COMMANDS.items():
        lines.append(f"  {name:<9} {command.summary}")
        lines += [f"      --{flag}: {text}" for flag, text in command.flags.items()]
    return "\n".join(lines)


def _parse(command: Command, name: str, args: Sequence[str]) -> dict[str, str]:
    positional = [a for a in args if not a.startswith("--")]
    flags = split_flags([a for a in args if a.startswith("--")])
    for flag in flags:
        if flag not in command.flags:
            raise ConfigError(f"{name}: unknown flag --{flag}{did_you_mean(flag, command.flags)}; its flags are " + ", ".join(f"--{f}" for f in command.flags))
    if positional and (not command.positional_dir or len(positional) > 1 or "checkpoint_dir" in flags):
        raise ConfigError(f"{name}: unexpected argument {positional[-1]!r}; pass the folder as --checkpoint_dir=DIR")
    if positional:
        flags["checkpoint_dir"] = positional[0]
    return flags


def run(argv: Sequence[str]) -> int:
    """Run one command; ConfigError (and CheckpointError) propagate to `main`."""
    if VERSION_FLAG in argv[:2]:
        print(versions_text(PROG))
        return 0
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, args = argv[0], argv[1:]
    if name not in COMMANDS:
        raise ConfigError(f"unknown command {name!r}{did_you_mean(name, COMMANDS)}; the commands are {', '.join(COMMANDS)}")
    if any(a in ("-h", "--help") for a in args):
        print(usage())
        return 0
    command = COMMANDS[name]
    return command.run(_parse(command, name, args))


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: a user error is one paragraph on stderr and exit code 2."""
    try:
        code = run(list(sys.argv[1:] if argv is None else argv))
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
