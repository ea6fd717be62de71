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
"""

from __future__ import annotations

from pathlib import Path

from ._configs import TrainConfig
from ._files import TrainingStep
from ._flags import parse_train_config
from ._launch import LaunchSpec, build_launch
from ._topology import Topology

__all__ = ["build_resume_launch", "resume_config", "resume_config_path", "resume_is_sample_exact"]

_RESUME_FLAG = "--resume=true"


def resume_config_path(step_dir: Path) -> Path:
    """The train_config.json a checkpoint step folder resumes from."""
    return Path(step_dir) / "pretrained_model" / "train_config.json"


def resume_config(step_dir: Path, overrides: list[str] | None = None) -> TrainConfig:
    """The saved config of `step_dir` with `overrides` merged over it, as the engine will see it."""
    flags = [_RESUME_FLAG, f"--config_path={resume_config_path(step_dir)}", *(overrides or [])]
    return parse_train_config(flags)


def build_resume_launch(spec: LaunchSpec, step_dir: Path, overrides: list[str] | None = None) -> list[str]:
    """argv resuming the checkpoint in `step_dir` under `spec`; raises ConfigError when invalid."""
    cfg = resume_config(step_dir, overrides)
    full = build_launch(spec, cfg)
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
