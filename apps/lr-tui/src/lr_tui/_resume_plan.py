"""What resuming a checkpoint would run, and whether it would be sample-exact.

`plan_resume(spec, step_dir, overrides, output_dir)` asks lr-config for the command
(`build_resume_launch`: the saved train_config.json plus only the overrides as flags,
validated for `spec`'s world size) and says whether the resumed run sees exactly the
samples the saved one would have (`resume_is_sample_exact`: batch_size x dp_world_size
unchanged). A resumed config carries the degrees the saved run asked for (unset stays unset,
`dp_shard=-1` infers again), so a new number of processes may need new degrees: lr-config's
refusal says which flags, the plan shows it instead of a command, and `fields_named` tells the
resume screen which of its fields those flags are (each flag such a message asks for has one:
processes, dp_replicate, dp_shard, steps, checkpoint format, and "more flags" for any other).
The command is the one that runs (`cli_tasks.launch_argv`: the launcher at this environment's
path, and the per-rank log options). Never raises; no torch.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from lr_config import (
    ConfigError,
    LaunchSpec,
    build_resume_launch,
    format_command,
    resolve_topology,
    resume_config,
    resume_is_sample_exact,
)
from lr_config.layout import CHECKPOINTS, LAST

from ._checkpoint_scan import read_training_step
from ._cli_tasks import launch_argv

__all__ = [
    "OVERRIDE_FLAGS",
    "ResumePlan",
    "describe_exactness",
    "fields_named",
    "last_checkpoint",
    "output_dir_override",
    "overrides_from",
    "plan_resume",
]

OVERRIDE_FLAGS = {
    "dp_replicate": "parallelism.dp_replicate",
    "dp_shard": "parallelism.dp_shard",
    "steps": "steps",
    "checkpoint_format": "checkpoint_format",
}
"""Resume form field -> the train flag it overrides (empty: keep the saved value)."""

EXTRA = "extra"
"""The resume form's "more flags" field: any other `--a.b=c` override."""

PROCESSES = "nproc_per_node"
_FLAG = re.compile(r"(?<![\w.-])--([a-z_][\w.]*)")
_PROCESSES = re.compile(r"\bprocess(?:es)?\b|--nproc-per-node|\bworld size\b")


@dataclass
class ResumePlan:
    step_dir: Path
    argv: list[str] | None = None
    preview: str = ""
    exactness: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.argv is not None


def last_checkpoint(run_dir: Path) -> Path | None:
    """The step folder `<run>/checkpoints/last` points to (absolute), or None."""
    link = Path(run_dir) / CHECKPOINTS / LAST
    if not link.exists():
        return None
    return link.resolve()


def output_dir_override(step_dir: Path, run_dir: Path) -> list[str]:
    """`--output_dir=<run_dir>` when the saved output dir does not lead to `run_dir` from here.

    The saved path may be relative to where the run was launched; the resumed run must
    write into the folder the TUI watches. Raises ConfigError for an unreadable config."""
    saved = resume_config(step_dir).output_dir
    if saved is not None and Path(saved).resolve() == Path(run_dir).resolve():
        return []
    return [f"--output_dir={Path(run_dir).absolute()}"]


def overrides_from(values: dict[str, str]) -> list[str]:
    """`--flag=value` for each non-empty resume form field, in a fixed order, then "more flags"
    as typed (split as a shell would; ValueError for an unclosed quote)."""
    flags = [f"--{flag}={values[key].strip()}" for key, flag in OVERRIDE_FLAGS.items() if values.get(key, "").strip()]
    return flags + shlex.split(values.get(EXTRA, ""))


def fields_named(line: str) -> list[str]:
    """The resume form fields a problem line asks to change, in form order: the field of each
    flag it names ("more flags" for a flag without one), and the processes when it speaks of
    how many will run."""
    by_flag = {flag: key for key, flag in OVERRIDE_FLAGS.items()}
    keys = {by_flag.get(flag, EXTRA) for flag in _FLAG.findall(line)}
    if _PROCESSES.search(line):
        keys.add(PROCESSES)
    order = [PROCESSES, *OVERRIDE_FLAGS, EXTRA]
    return sorted(keys, key=order.index)


def describe_exactness(step_dir: Path, spec: LaunchSpec, overrides: list[str]) -> str:
    """`sample-exact: yes (...)` or `no (...)`; raises ConfigError when the overrides do not fit."""
    ts, problem = read_training_step(step_dir)
    if ts is None:
        return f"sample-exact: unknown ({problem})"
    cfg = resume_config(step_dir, overrides)
    topo = resolve_topology(cfg.parallelism, spec.world_size, spec.nnodes)
    before = f"{ts.batch_size} x dp {ts.dp_world_size}"
    after = f"{cfg.batch_size} x dp {topo.dp_world_size}"
    if resume_is_sample_exact(ts, cfg, topo):
        return f"sample-exact: yes (batch {after} = {cfg.batch_size * topo.dp_world_size}, as saved)"
    if ts.seed != cfg.seed:
        return f"sample-exact: no (seed {ts.seed} -> {cfg.seed}: the data order follows the seed); resumes at the same epoch and offset"
    return f"sample-exact: no (batch {before} -> {after}); resumes at the right epoch and offset"


def plan_resume(spec: LaunchSpec, step_dir: Path, overrides: list[str], output_dir: Path | None = None) -> ResumePlan:
    """The resume command for `step_dir` under `spec` with `overrides`, or lr-config's problems."""
    plan = ResumePlan(step_dir=step_dir)
    try:
        argv = build_resume_launch(spec, step_dir, overrides)
        plan.exactness = describe_exactness(step_dir, spec, overrides)
    except ConfigError as exc:
        plan.problems = exc.problems or [str(exc)]
        return plan
    plan.argv = launch_argv(argv, output_dir)
    plan.preview = format_command(plan.argv)
    return plan
