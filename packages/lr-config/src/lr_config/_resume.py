"""Resume commands for a saved checkpoint.

`build_resume_launch(spec, step_dir, overrides)` returns the argv that resumes the run saved
in `step_dir` (a `checkpoints/<step>` folder) with the launcher `spec` describes:

    <launcher> -m lr_engine.cli train --resume=true
        --config_path=<step_dir>/pretrained_model/train_config.json <overrides>

Only the overrides travel as flags; everything else comes from the saved config. The
saved config with the overrides applied is validated for `spec`'s world size first, so a
command it returns never fails at start-up on topology (a changed layout needs its new
`--parallelism.*` flags among the overrides).

`resume_is_sample_exact(training_step, cfg, topology)` says whether the resumed run sees
exactly the samples the original would have: the global sample order depends only on
(seed, epoch), and each loop step takes `batch_size x dp_world_size` of it, so the resume
is exact when that product is unchanged, whatever the topology. Pure Python, no torch.

`resume_problems(saved_step, cfg)` is why a resume of a checkpoint at `saved_step` cannot go
on with `cfg`: `--steps` that trains nothing more, or an accumulation whose first update would
be partial. The engine refuses those before it writes anything, and `build_resume_launch`
before it builds a command.
"""

from __future__ import annotations

import math
from pathlib import Path

from ._configs import TrainConfig
from ._errors import ConfigError
from ._files import TrainingStep, load_training_step
from ._flags import parse_train_config
from ._launch import LaunchSpec, build_launch
from ._topology import Topology
from .layout import StepFiles

__all__ = ["build_resume_launch", "resume_config", "resume_config_path", "resume_is_sample_exact", "resume_problems"]

_RESUME_FLAG = "--resume=true"


def resume_config_path(step_dir: Path) -> Path:
    """The train_config.json a checkpoint step folder resumes from."""
    return StepFiles(Path(step_dir)).train_config


def resume_config(step_dir: Path, overrides: list[str] | None = None) -> TrainConfig:
    """The saved config of `step_dir` with `overrides` merged over it, as the engine will see it."""
    flags = [_RESUME_FLAG, f"--config_path={resume_config_path(step_dir)}", *(overrides or [])]
    return parse_train_config(flags)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def _one_of(values: list[int]) -> str:
    return ", ".join(str(v) for v in values[:-1]) + (" or " if len(values) > 1 else "") + str(values[-1])


def resume_problems(saved_step: int, cfg: TrainConfig) -> list[str]:
    """Why the checkpoint at loop step `saved_step` cannot continue as `cfg` says: a run that
    would train nothing (--steps at or below the step, or short of one update) or whose first
    update would apply a partial accumulation (the step is not a multiple of the new K)."""
    k = cfg.grad_accum_steps
    problems = []
    if k >= 1 and saved_step % k:
        fits = _divisors(saved_step)
        near = sorted({*[d for d in fits if d < k][-2:], *[d for d in fits if d > k][:2]})
        problems.append(
            f"--accelerator.gradient_accumulation.steps: the checkpoint is at step {saved_step}, which is not a multiple of "
            f"{k}, so the first update would apply a partial accumulation; use a value that divides {saved_step}: " + _one_of(near)
        )
    if cfg.steps <= saved_step:
        problems.append(f"--steps: the checkpoint is at step {saved_step}; pass --steps > {saved_step} to continue")
    elif cfg.steps < saved_step + k:
        problems.append(
            f"--steps: the checkpoint is at step {saved_step} and an optimizer update takes {k} loop steps "
            f"(--accelerator.gradient_accumulation.steps={k}); pass --steps >= {saved_step + k} to continue"
        )
    return problems


def build_resume_launch(spec: LaunchSpec, step_dir: Path, overrides: list[str] | None = None) -> list[str]:
    """argv resuming the checkpoint in `step_dir` under `spec`; raises ConfigError when invalid
    (the settings, or a resume that cannot go on: `resume_problems`)."""
    cfg = resume_config(step_dir, overrides)
    full = build_launch(spec, cfg)
    saved = load_training_step(StepFiles(Path(step_dir)).training_step)
    problems = resume_problems(saved.step, cfg)
    if problems:
        raise ConfigError(problems[0], problems=problems)
    launcher = full[: full.index("-m")]
    return [
        *launcher,
        "-m",
        "lr_engine.cli",
        "train",
        _RESUME_FLAG,
        f"--config_path={resume_config_path(step_dir)}",
        *(overrides or []),
    ]


def resume_is_sample_exact(training_step: TrainingStep, cfg: TrainConfig, topology: Topology) -> bool:
    """True when the resumed run consumes the global sample order exactly as the saved one did."""
    same_batch = training_step.batch_size * training_step.dp_world_size == cfg.batch_size * topology.dp_world_size
    return same_batch and training_step.seed == cfg.seed  # the order of every epoch follows the seed
