"""`lr-engine eval`: its settings (`EvalRunConfig`, parsed from `--a.b=value` flags) and the
file it writes (`EvalInfo`, `eval_info.json`). No torch.

The flags follow `lerobot-eval`'s: `--policy.path` (a checkpoint folder or a Hub repo id),
`--eval.n_episodes`, `--eval.batch_size`, `--policy.device`, `--output_dir`, `--seed`. The
environment is lr's demo task (`--env.type=reach2d`, the scripted reaching task the demo
dataset is recorded from). `--policy.baseline=expert|random` rolls out the scripted expert
or uniformly random actions instead of a trained policy: the two ends of the scale.

Episode `i` starts from seed `seed + i`, so two evals of the same policy with the same
settings see the same episodes, whatever the batch size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ._configs import EvalAggregate, EvalConfig, EvalEnvConfig, doc, sub
from ._errors import ConfigError
from ._flags import _decode, _leaf_docs, _set, _type_at, split_flags
from ._serde import from_dict, load_json, save_json, to_dict
from .layout import PRETRAINED

__all__ = [
    "EVAL_INFO_VERSION",
    "EpisodeResult",
    "EvalAggregate",
    "EvalConfig",
    "EvalEnvConfig",
    "EvalInfo",
    "EvalPolicyConfig",
    "EvalRunConfig",
    "format_eval_help",
    "load_eval_info",
    "parse_eval_config",
    "save_eval_info",
    "wilson_interval",
]

EVAL_INFO_VERSION = 1


@dataclass
class EvalPolicyConfig:
    path: str | None = doc(None, f"A checkpoint step folder, its {PRETRAINED}/, a run folder (its final model), or a Hub repo id (user/name).")
    pretrained_revision: str | None = doc(None, "With a Hub repo id: the branch, tag or commit to download.")
    baseline: Literal["expert", "random"] | None = doc(None, "Instead of a trained policy: the scripted expert, or uniformly random actions.")
    device: Literal["auto", "cpu", "cuda"] = doc("auto", "Where the policy runs (auto: cuda when available).")


@dataclass
class EvalRunConfig:
    policy: EvalPolicyConfig = sub(EvalPolicyConfig, "The policy to roll out.")
    eval: EvalConfig = sub(EvalConfig, "How many episodes, how many at once.")
    env: EvalEnvConfig = sub(EvalEnvConfig, "The environment.")
    seed: int = doc(1000, "Episode i starts from seed + i.")
    output_dir: Path | None = doc(None, "Where eval_info.json (and videos) go; default outputs/eval/<date>/<time>_<policy>.")


@dataclass
class EpisodeResult:
    index: int = 0
    seed: int = 0
    success: bool = False
    sum_reward: float = 0.0
    """The sum over the episode's steps of the step reward, minus the distance to the target."""
    length: int = 0
    """Steps taken: up to success, or max_episode_steps."""


@dataclass
class EvalInfo:
    version: int = EVAL_INFO_VERSION
    policy: str = ""
    """What was rolled out: the checkpoint folder, the Hub repo id, or `baseline:<name>`."""
    policy_step: int | None = None
    """The checkpoint's training step, when it records one."""
    env: EvalEnvConfig = field(default_factory=EvalEnvConfig)
    seed: int = 0
    batch_size: int = 0
    created: str = ""
    episodes: list[EpisodeResult] = field(default_factory=list)
    aggregate: EvalAggregate = field(default_factory=EvalAggregate)
    videos: list[str] = field(default_factory=list)
    """Saved rollouts, relative to the eval folder."""


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a success rate (95% by default); (0, 1) for n = 0."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def parse_eval_config(argv: list[str]) -> EvalRunConfig:
    """`lr-engine eval` flags -> EvalRunConfig; a ConfigError names the flag to change."""
    tree = to_dict(EvalRunConfig())
    for name, raw in split_flags(argv).items():
        tp = _type_at(EvalRunConfig, name)
        _set(tree, name.split("."), _decode(raw, tp))
    cfg = from_dict(EvalRunConfig, tree, source="flags")
    _check(cfg)
    return cfg


def _check(cfg: EvalRunConfig) -> None:
    if cfg.policy.path is None and cfg.policy.baseline is None:
        raise ConfigError("--policy.path: which policy to evaluate? Pass a checkpoint folder or a Hub repo id "
                          "(or --policy.baseline=expert|random)")
    if cfg.policy.path is not None and cfg.policy.baseline is not None:
        raise ConfigError("--policy.baseline: give either --policy.path or --policy.baseline, not both")
    for flag, value in (("eval.n_episodes", cfg.eval.n_episodes), ("eval.batch_size", cfg.eval.batch_size),
                        ("env.max_episode_steps", cfg.env.max_episode_steps)):
        if value < 1:
            raise ConfigError(f"--{flag}={value}: must be at least 1")
    if cfg.eval.videos < 0:
        raise ConfigError(f"--eval.videos={cfg.eval.videos}: must be 0 or more")
    if not cfg.env.success_radius > 0:
        raise ConfigError(f"--env.success_radius={cfg.env.success_radius}: must be above 0")


def format_eval_help() -> str:
    """`lr-engine eval --help`: every flag with its type, default and one line of doc."""
    lines = ["usage: lr-engine eval --policy.path=FOLDER_OR_REPO_ID [--name=value ...]", "",
             "Rolls the policy out in lr's demo reaching task and writes eval_info.json.", ""]
    for path, type_name, default, text in _leaf_docs(EvalRunConfig):
        lines += [f"  --{path}  {type_name}  (default: {default})", f"      {text}"]
    return "\n".join(lines)


def save_eval_info(path: Path, info: EvalInfo) -> None:
    save_json(path, to_dict(info))


def load_eval_info(path: Path) -> EvalInfo:
    return load_json(path, EvalInfo, current_version=EVAL_INFO_VERSION)
