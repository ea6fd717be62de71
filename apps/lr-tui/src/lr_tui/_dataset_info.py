"""What the Launch form says about the chosen dataset before a run: where it is on this machine
(local, the demo, LeRobot's download, the Hugging Face cache, or still to be downloaded), and
what `meta/info.json` holds: episodes, frames, fps, cameras (resolution, codec) and the sizes of
state, environment state and action. It reads only `meta/info.json` (no torch, no network),
through `lr_config.datasets`, the rule lr-engine itself follows, so a feature the policy would
not take is flagged here before launch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lr_config import ConfigError
from lr_config.datasets import locate_meta, policy_features

__all__ = ["DatasetInfo", "dataset_info"]


@dataclass(frozen=True)
class DatasetInfo:
    lines: list[str]
    problems: list[str]
    """Lines that stop a run or drop data: no action, no observation, features no policy takes."""

    def text(self) -> str:
        return "\n".join([*self.lines, *self.problems])


def dataset_info(repo_id: str, root: Path | None, revision: str | None) -> DatasetInfo:
    location = locate_meta(repo_id, root, revision)
    if location.where == "missing":
        return DatasetInfo([], [location.note])
    try:
        info = location.info()
    except ConfigError as exc:
        return DatasetInfo([location.note], [str(exc)])
    if info is None:
        return DatasetInfo([location.note], [])
    where = str(location.meta_dir / "meta" / "info.json") if location.meta_dir is not None else repo_id
    lines = [location.note, _sizes(info)]
    try:
        found = policy_features(info, where)
    except ConfigError as exc:
        return DatasetInfo(lines, [str(exc)])
    lines.append(_features(info, found.inputs, found.outputs))
    problems = [f"not taken by lr's policies (ignored): {', '.join(found.ignored)}"] if found.ignored else []
    return DatasetInfo(lines, problems)


def _sizes(info: dict[str, Any]) -> str:
    return f"{info.get('total_episodes', '?')} episodes, {info.get('total_frames', '?')} frames, {info.get('fps', '?')} fps"


def _features(info: dict[str, Any], inputs: dict[str, Any], outputs: dict[str, Any]) -> str:
    features = dict(info.get("features", {}))
    parts = []
    for key, spec in inputs.items():
        if spec.type == "VISUAL":
            feat = features[key]
            codec = (feat.get("info") or {}).get("video.codec", "video") if feat.get("dtype") == "video" else "png"
            parts.append(f"camera {key.removeprefix('observation.images.')} {spec.shape[1]}x{spec.shape[2]} {codec}")
        else:
            name = "env" if spec.type == "ENV" else key.removeprefix("observation.")
            parts.append(f"{name} {'x'.join(str(s) for s in spec.shape)}")
    parts += [f"{key} {'x'.join(str(s) for s in spec.shape)}" for key, spec in outputs.items()]
    return "; ".join(parts)
