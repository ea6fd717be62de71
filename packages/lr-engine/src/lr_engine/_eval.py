"""`lr-engine eval`: roll a policy out in the demo reaching task and score it.

The environment is the task the demo dataset records (`_data/demo.py`: a point agent
moved by velocity commands towards a target, both drawn uniformly in [-1, 1]^2). An episode
succeeds when the agent comes within `--env.success_radius` of its target, and fails after
`--env.max_episode_steps` steps; its reward is the sum over its steps of minus the distance
to the target. Episode i starts from `default_rng(seed + i)`, so the episodes are the same
for every policy, batch size and run.

`--eval.batch_size` episodes are stepped together: one observation batch per step, through
the policy's own pre-processor, `select_action` (its action queue: a new chunk every
`n_action_steps` calls, cleared by `reset()` at each batch's start) and post-processor.
An episode that ended keeps receiving observations (its last state) until its batch ends;
its actions are ignored, as in LeRobot's vectorized evaluation.

The result is `eval_info.json` (`lr_config.EvalInfo`: every episode, and the aggregate with
a 95% Wilson interval of the success rate), written atomically into a new folder; a folder
that already holds one is refused, never overwritten.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from lr_config import (
    ConfigError,
    EpisodeResult,
    EvalAggregate,
    EvalInfo,
    EvalRunConfig,
    FeatureSpec,
    load_run_status,
    load_training_step,
    save_eval_info,
    wilson_interval,
)
from lr_config.layout import EVAL_INFO, EVAL_OUTPUTS, PRETRAINED, RUN_STATUS, StepFiles

from ._hub_models import model_folder
from ._data.demo import FPS, MAX_SPEED, Cameras, expert_action, move, render, start_positions

__all__ = ["EvalResult", "Reach2D", "aggregate", "evaluate", "policy_actor", "policy_cameras", "run_eval"]

STATE = "observation.state"
ENV_STATE = "observation.environment_state"
IMAGE_PREFIX = "observation.images."
VIDEO_SIZE = 96
"""Saved rollouts are rendered at this size (the policy sees its own camera size)."""

Actor = Callable[[dict[str, np.ndarray]], np.ndarray]
"""Observations (numpy, batched) -> actions [B, 2]."""


class Reach2D:
    """A batch of reaching episodes stepped together (numpy, no torch)."""

    def __init__(self, seeds: list[int], success_radius: float, max_steps: int) -> None:
        starts = [start_positions(np.random.default_rng(seed)) for seed in seeds]
        self.agent = np.array([a for a, _ in starts])
        self.target = np.array([t for _, t in starts])
        self.radius, self.max_steps = success_radius, max_steps
        n = len(seeds)
        self.done = np.zeros(n, dtype=bool)
        self.success = np.zeros(n, dtype=bool)
        self.length = np.zeros(n, dtype=np.int64)
        self.reward = np.zeros(n)

    def distance(self) -> np.ndarray:
        return np.linalg.norm(self.target - self.agent, axis=-1)

    def observation(self, cameras: dict[str, tuple[int, int]]) -> dict[str, np.ndarray]:
        """`observation.state` (agent), `observation.environment_state` (target) and one
        [B, H, W, 3] uint8 rendering per camera name, at its (height, width)."""
        obs = {STATE: self.agent.astype(np.float32), ENV_STATE: self.target.astype(np.float32)}
        for i, (name, (height, width)) in enumerate(cameras.items()):
            cams = Cameras(names=(name,), height=height, width=width)
            obs[IMAGE_PREFIX + name] = np.stack([render(a, t, cams, i) for a, t in zip(self.agent, self.target)])
        return obs

    def step(self, action: np.ndarray) -> None:
        live = ~self.done
        self.agent[live] = move(self.agent[live], np.asarray(action, dtype=np.float64)[live])
        self.length[live] += 1
        distance = self.distance()
        self.reward[live] -= distance[live]
        self.success |= live & (distance < self.radius)
        self.done |= self.success | (self.length >= self.max_steps)


# ---------------------------------------------------------------- the policies rolled out


def expert_actor() -> Actor:
    return lambda obs: expert_action(obs[STATE].astype(np.float64), obs[ENV_STATE].astype(np.float64))


def random_actor(seed: int) -> Actor:
    rng = np.random.default_rng(seed)
    return lambda obs: rng.uniform(-MAX_SPEED, MAX_SPEED, size=(len(obs[STATE]), 2))


@dataclass
class LoadedPolicy:
    """A trained policy with its processors, and what its folder says about it."""

    folder: Path
    label: str
    step: int | None
    cameras: dict[str, tuple[int, int]]
    act: Actor
    reset: Callable[[], None]




def policy_cameras(features: dict[str, FeatureSpec], flag: str = "--policy.path") -> dict[str, tuple[int, int]]:
    """The cameras (name -> height, width) the environment must render for a policy taking
    `features`; a ConfigError naming `flag` for a feature the environment does not give."""
    cameras: dict[str, tuple[int, int]] = {}
    for key, spec in features.items():
        if key.startswith(IMAGE_PREFIX) and len(spec.shape) == 3 and spec.shape[0] == 3:
            _, height, width = spec.shape
            cameras[key[len(IMAGE_PREFIX) :]] = (int(height), int(width))
        elif key not in (STATE, ENV_STATE) or list(spec.shape) != [2]:
            raise ConfigError(f"{flag}: the policy takes {key!r} of shape {list(spec.shape)}, which the reach2d environment does not give "
                              f"(it gives {STATE} [2], {ENV_STATE} [2] and {IMAGE_PREFIX}<camera> [3, H, W])")
    return cameras


def policy_actor(policy: Any, pre: Callable[[dict[str, Any]], dict[str, Any]], post: Callable[[dict[str, Any]], dict[str, Any]],
                 device: Any) -> Actor:
    """Observations -> actions through the policy's pre-processor, `select_action` and post-processor."""
    import torch

    def act(obs: dict[str, np.ndarray]) -> np.ndarray:
        batch = {}
        for key, value in obs.items():
            tensor = torch.from_numpy(value)
            if key.startswith(IMAGE_PREFIX):  # [B, H, W, 3] uint8 -> [B, 3, H, W] in [0, 1], as the dataset gives frames
                tensor = tensor.permute(0, 3, 1, 2).float().div_(255.0)
            batch[key] = tensor.to(device)
        with torch.inference_mode():
            action = policy.select_action(pre(batch))
            action = post({"action": action})["action"]
        result: np.ndarray = action.float().cpu().numpy()
        return result

    return act


def trained_step(folder: Path) -> int | None:
    """The training step of a model folder: its checkpoint's training_step.json, or, for a run's
    final model, the step its run.json ended at; None for a folder that records neither."""
    files = StepFiles(folder.parent)
    if folder.name == PRETRAINED and files.training_step.is_file():
        return load_training_step(files.training_step).step
    if folder.name == PRETRAINED and (folder.parent / RUN_STATUS).is_file():
        return load_run_status(folder.parent / RUN_STATUS).step
    return None


def load_policy(cfg: EvalRunConfig, device: str) -> LoadedPolicy:
    from ._policies import load_pretrained
    from ._processors import load_processors

    assert cfg.policy.path is not None
    folder, label = model_folder(cfg.policy.path, cfg.policy.pretrained_revision)
    policy = load_pretrained(folder).to(device).eval()
    pre, post = load_processors(folder)
    cameras = policy_cameras(policy.config.input_features)
    act = policy_actor(policy, pre, post, device)
    return LoadedPolicy(folder=folder, label=label, step=trained_step(folder), cameras=cameras, act=act, reset=policy.reset)


# ---------------------------------------------------------------- rolling out


@dataclass
class EvalResult:
    info: EvalInfo
    output_dir: Path


def _rollout(env: Reach2D, act: Actor, cameras: dict[str, tuple[int, int]], record: int) -> list[np.ndarray]:
    """Step `env` until every episode ended; the frames of its first `record` episodes."""
    frames: list[list[np.ndarray]] = [[] for _ in range(record)]
    view = Cameras(names=("top",), height=VIDEO_SIZE, width=VIDEO_SIZE)
    while not env.done.all():
        for i in range(record):
            if not env.done[i]:
                frames[i].append(render(env.agent[i], env.target[i], view, 0))
        env.step(act(env.observation(cameras)))
    for i in range(record):
        frames[i].append(render(env.agent[i], env.target[i], view, 0))
    return [np.stack(f) for f in frames]


def evaluate(cfg: EvalRunConfig, act: Actor, cameras: dict[str, tuple[int, int]], reset: Callable[[], None],
             video_dir: Path | None = None) -> tuple[list[EpisodeResult], list[Path]]:
    """Every episode of the eval, in batches; the first `--eval.videos` saved under `video_dir`."""
    from ._data.video import encode_video

    episodes: list[EpisodeResult] = []
    videos: list[Path] = []
    for first in range(0, cfg.eval.n_episodes, cfg.eval.batch_size):
        seeds = [cfg.seed + i for i in range(first, min(first + cfg.eval.batch_size, cfg.eval.n_episodes))]
        env = Reach2D(seeds, cfg.env.success_radius, cfg.env.max_episode_steps)
        reset()
        record = max(0, min(len(seeds), cfg.eval.videos - first)) if video_dir is not None else 0
        for i, frames in enumerate(_rollout(env, act, cameras, record)):
            path = video_dir / f"episode_{first + i:04d}.mp4"  # type: ignore[operator]
            videos.append(encode_video(frames, path, FPS))
        episodes += [EpisodeResult(index=first + i, seed=seed, success=bool(env.success[i]), sum_reward=float(env.reward[i]),
                                   length=int(env.length[i])) for i, seed in enumerate(seeds)]
    return episodes, videos


def aggregate(episodes: list[EpisodeResult]) -> EvalAggregate:
    n = len(episodes)
    wins = sum(e.success for e in episodes)
    low, high = wilson_interval(wins, n)
    return EvalAggregate(n_episodes=n, success_rate=wins / n if n else 0.0, success_ci95_low=low, success_ci95_high=high,
                         avg_sum_reward=float(np.mean([e.sum_reward for e in episodes])) if n else 0.0,
                         avg_length=float(np.mean([e.length for e in episodes])) if n else 0.0)


def _output_dir(cfg: EvalRunConfig, label: str) -> Path:
    if cfg.output_dir is not None:
        out = Path(cfg.output_dir)
        if (out / EVAL_INFO).exists():
            raise ConfigError(f"--output_dir={out}: it already holds {EVAL_INFO}; pass a new folder (nothing was overwritten)")
        return out
    now = _dt.datetime.now()
    name = re.sub(r"[^\w.-]+", "_", label.rstrip("/").rpartition("/")[2]) or "policy"
    return EVAL_OUTPUTS / now.strftime("%Y-%m-%d") / f"{now.strftime('%H-%M-%S')}_{name}"


def _device(cfg: EvalRunConfig) -> str:
    import torch

    if cfg.policy.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.policy.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--policy.device=cuda: no CUDA device here; pass --policy.device=cpu or auto")
    return cfg.policy.device


def run_eval(cfg: EvalRunConfig) -> EvalResult:
    """Load (or pick) the policy, roll it out, write eval_info.json, print the summary."""
    if cfg.policy.baseline is not None:
        label, step, cameras = f"baseline:{cfg.policy.baseline}", None, {}
        act = expert_actor() if cfg.policy.baseline == "expert" else random_actor(cfg.seed)
        reset: Callable[[], None] = lambda: None  # noqa: E731
    else:
        loaded = load_policy(cfg, _device(cfg))
        label, step, cameras, act, reset = loaded.label, loaded.step, loaded.cameras, loaded.act, loaded.reset
    out = _output_dir(cfg, label)
    episodes, videos = evaluate(cfg, act, cameras, reset, out / "videos" if cfg.eval.videos else None)
    info = EvalInfo(policy=label, policy_step=step, env=cfg.env, seed=cfg.seed, batch_size=cfg.eval.batch_size,
                    created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), episodes=episodes,
                    aggregate=aggregate(episodes), videos=[str(v.relative_to(out)) for v in videos])
    save_eval_info(out / EVAL_INFO, info)
    print(summary(info), flush=True)
    print(f"eval_info: {out / EVAL_INFO}" + (f"; videos in {out / 'videos'}" if videos else ""), flush=True)
    return EvalResult(info=info, output_dir=out)


def summary(info: EvalInfo) -> str:
    agg = info.aggregate
    at = f" (step {info.policy_step})" if info.policy_step is not None else ""
    return (f"eval {info.policy}{at} on {info.env.type}: {agg.n_episodes} episodes, success {100 * agg.success_rate:.1f}% "
            f"(95% CI {100 * agg.success_ci95_low:.1f}-{100 * agg.success_ci95_high:.1f}%), "
            f"avg sum reward {agg.avg_sum_reward:.2f}, avg length {agg.avg_length:.1f}")
