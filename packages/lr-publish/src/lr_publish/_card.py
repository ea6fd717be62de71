"""The model card (README.md) of a published policy.

YAML metadata (written by `huggingface_hub.ModelCardData`, so the Hub and `ModelCard`
parse it): license (the policy config's `license`), `library_name: lr`,
`pipeline_tag: robotics`, tags (policy type, lr, robotics), the dataset repo id, and for a
LoRA adapter `base_model` when the base is a Hub repo id (a local base path is named in
the body instead: the Hub rejects a `base_model` that is not a repo id).

The body says what was trained and how: steps, the effective batch breakdown
(`lr_config.banner_line`), topology, precision, optimizer, and the dataset's episodes,
frames, fps and features read from `<dataset.root>/meta/info.json`; then how to load it.
Nothing secret is read or written here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from huggingface_hub import ModelCardData
from lr_config import ConfigError, TrainConfig, TrainingStep, banner_line, check_repo_id, read_json_object

__all__ = ["model_card"]

_BOOKKEEPING = frozenset({"timestamp", "frame_index", "episode_index", "index", "task_index"})


def model_card(
    repo_id: str,
    *,
    train_config: TrainConfig,
    training_step: TrainingStep,
    adapter_config: dict[str, Any] | None = None,
) -> str:
    """README.md text for `repo_id` (metadata block, then the body)."""
    base = None if adapter_config is None else str(adapter_config.get("base_model_name_or_path") or "")
    parts = [
        "---\n" + _metadata(train_config, base).to_yaml() + "\n---",
        _summary(repo_id, train_config, adapter_config),
        _training_section(train_config, training_step),
        _dataset_section(train_config),
        _loading_section(repo_id, adapter=adapter_config is not None, lerobot=train_config.policy.type_name == "act"),
    ]
    return "\n\n".join(parts) + "\n"


def _is_repo_id(text: str) -> bool:
    try:
        check_repo_id(text)
    except ConfigError:
        return False
    return not Path(text).exists()


def _metadata(cfg: TrainConfig, base: str | None) -> ModelCardData:
    policy_type = cfg.policy.type_name
    return ModelCardData(
        license=cfg.policy.license,
        library_name="lr",
        pipeline_tag="robotics",
        tags=[policy_type, "lr", "robotics"],
        datasets=[cfg.dataset.repo_id],
        base_model=base if base and _is_repo_id(base) else None,
    )


def _summary(repo_id: str, cfg: TrainConfig, adapter_config: dict[str, Any] | None) -> str:
    name = repo_id.split("/")[-1]
    text = (f"# {name}\n\nA policy of type **{cfg.policy.type_name}**, trained with lr on the dataset "
            f"`{cfg.dataset.repo_id}`.")
    if adapter_config is not None:
        base = adapter_config.get("base_model_name_or_path") or "unknown"
        text += (f" These are LoRA adapter weights (rank {adapter_config.get('r')}) on top of the base policy "
                 f"`{base}`; load the base first, then the adapter.")
    return text


def _training_section(cfg: TrainConfig, step: TrainingStep) -> str:
    opt, sched = cfg.optimizer, cfg.scheduler
    rows = [
        ("steps", f"{step.step} loop steps (micro-batches per process) of {cfg.steps} planned"),
        ("optimizer updates", str(step.optimizer_updates)),
        ("samples seen", str(step.samples_seen)),
        ("effective batch", banner_line(cfg, step.topology)),
        ("precision", "fp32 (no mixed precision)" if step.precision == "no" else f"{step.precision} mixed precision"),
        ("optimizer", f"{opt.type}, peak lr {opt.lr:g}, weight decay {opt.weight_decay:g}, "
                      f"{sched.type} schedule after {sched.warmup_steps} warmup steps"),
        ("seed", str(step.seed)),
    ]
    if cfg.peft.method_type is not None:
        rows.append(("fine-tuning", f"{cfg.peft.method_type} r={cfg.peft.r}"))
    table = "\n".join(f"| {key} | {value} |" for key, value in rows)
    return f"## Training\n\n| setting | value |\n|---|---|\n{table}"


def _read_info(root: Path | None) -> dict[str, Any] | None:
    if root is None:
        return None
    try:
        return read_json_object(Path(root) / "meta" / "info.json")
    except ConfigError:  # the card is written without the dataset's details
        return None


def _dataset_section(cfg: TrainConfig) -> str:
    head = f"## Dataset\n\n`{cfg.dataset.repo_id}`"
    info = _read_info(cfg.dataset.root)
    if info is None:
        return head + f" (its `meta/info.json` was not readable under `{cfg.dataset.root}` when this card was written)."
    total = info.get("total_episodes")
    used = f"{len(cfg.dataset.episodes)} of {total}" if cfg.dataset.episodes is not None else f"all {total}"
    text = (f"{head}: {total} episodes, {info.get('total_frames')} frames at {info.get('fps')} fps; "
            f"trained on {used} episodes.")
    features = {k: v for k, v in (info.get("features") or {}).items() if k not in _BOOKKEEPING}
    if features:
        rows = "\n".join(f"| `{key}` | {spec.get('dtype')} | {spec.get('shape')} |" for key, spec in features.items())
        text += f"\n\n| feature | dtype | shape |\n|---|---|---|\n{rows}"
    return text


def _loading_section(repo_id: str, *, adapter: bool, lerobot: bool = False) -> str:
    weights = "adapter_model.safetensors" if adapter else "model.safetensors"
    code = (
        "```python\n"
        "import json\n"
        "from huggingface_hub import snapshot_download\n"
        "from safetensors.torch import load_file\n\n"
        f'folder = snapshot_download("{repo_id}")\n'
        'config = json.load(open(f"{folder}/config.json"))  # the policy config, tagged by "type"\n'
        f'state_dict = load_file(f"{{folder}}/{weights}")\n'
        "```"
    )
    tail = ("Fine-tune it with lr: `lr-engine train --policy.path=<folder> --dataset.repo_id=...`."
            if not adapter else
            "Merge the adapter into the base policy's weights, or train on with lr from the base.")
    if lerobot and not adapter:  # lr's act is LeRobot's ACT, in LeRobot's files
        code = (
            "LeRobot (0.6.1) loads it as it is:\n\n"
            "```python\n"
            "from lerobot.policies.act.modeling_act import ACTPolicy\n"
            "from lerobot.policies.factory import make_pre_post_processors\n\n"
            f'policy = ACTPolicy.from_pretrained("{repo_id}")\n'
            f'preprocessor, postprocessor = make_pre_post_processors(policy.config, pretrained_path="{repo_id}")\n'
            "```\n\nOr read the files directly:\n\n" + code
        )
    return ("## How to load\n\n" + code + "\n\n`train_config.json` holds every training setting; "
            "`policy_preprocessor.json` / `policy_postprocessor.json` the normalization.\n\n" + tail)
