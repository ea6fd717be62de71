"""`--a.b.c=value` flags on top of the strict converter.

`parse_train_config(argv)`:
1. splits `--path=value` flags (a bare `--flag` means true);
2. starts from `--config_path`'s file when given, else from the defaults;
3. JSON-decodes each value where it parses (a string otherwise; a field typed as a string
   or path always keeps the raw text; `null` and `None` both mean unset), checks the path
   exists ("did you mean"), and deep-merges it;
4. structures the result strictly; errors name the flag.

Changing `--policy.type` swaps the policy block for the new type's defaults before the
other `--policy.*` flags are merged, as LeRobot users expect. `--policy.path=<folder>`
(fine-tuning) starts the policy block from that folder's config.json instead, its type
included, and the other `--policy.*` flags are merged over it (an architecture setting that
does not fit the saved weights is refused when they load). A resume keeps the policy settings
of its checkpoint: there `--policy.path` only says where the base model now is (LoRA).

`resume` is only ever asked for on the command line: a file's `"resume": true` (every resumed
run saves one in its checkpoints) is read as false, so `--config_path=<checkpoint>` without
`--resume=true` starts a new run with those settings whatever the run's history was.

A resume (`--resume=true`) writes into the run folder that holds the checkpoint named by
`--config_path`, not into the `output_dir` its saved train_config.json names: that path may
be stale (the run was moved or copied) or point anywhere. An explicit `--output_dir` wins.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from pathlib import Path
from typing import Any, Literal

from ._configs import PolicyConfigBase, TrainConfig
from ._errors import ConfigError, did_you_mean
from ._files import load_train_config
from .layout import CHECKPOINTS, LAST, PRETRAINED, TRAIN_CONFIG, StepFiles, last_train_config, run_folder_of
from ._policy_file import load_policy_config
from ._serde import field_names_at, fields_of, from_dict, hints, policy_classes, policy_types, to_dict, unwrap_optional

__all__ = ["all_flag_paths", "field_names_at", "format_help", "parse_train_config", "split_flags"]


def split_flags(argv: list[str]) -> dict[str, str]:
    """`["--a.b=1", "--c"]` -> `{"a.b": "1", "c": "true"}`; anything else is an error."""
    flags: dict[str, str] = {}
    for arg in argv:
        if not arg.startswith("--") or arg == "--":
            raise ConfigError(f"{arg!r}: expected --name=value (for example --steps=100)")
        name, sep, value = arg[2:].partition("=")
        if not name or name.startswith("-") or " " in name:
            raise ConfigError(f"{arg!r}: malformed flag; expected --name=value")
        if name in flags:
            raise ConfigError(f"--{name} given twice")
        flags[name] = value if sep else "true"
    return flags


def _type_at(root: type, path: str) -> Any:
    """The annotation at a dotted path, or raise ConfigError with suggestions."""
    tp: Any = root
    walked: list[str] = []
    for part in path.split("."):
        fields = fields_of(tp)
        if fields is None:
            if typing.get_origin(unwrap_optional(tp)) is dict:
                tp = typing.get_args(unwrap_optional(tp))[1]
                walked.append(part)
                continue
            raise ConfigError(f"--{path}: --{'.'.join(walked)} is a value, not a group of settings")
        if part not in fields:
            here = ".".join(walked + [part])
            hint = _flag_hint(root, path, here) or did_you_mean(part, fields)
            raise ConfigError(f"--{path}: unknown flag{hint}. Run with --help to list every flag.")
        tp = fields[part]
        walked.append(part)
    return tp


def _flag_hint(root: type, path: str, here: str) -> str:
    """' (did you mean ...?)' for an unknown flag `path` (first unknown at `here`): a flag it is
    the end of (`--lr`, `--fsdp.wrap_modules`), then one with its last name in another group
    (`--accelerator.dp_shard`), then the closest spellings of the whole path and of `here`."""
    flags = all_flag_paths(root)
    leaf = path.rpartition(".")[2]
    for found in ([f for f in flags if f.endswith("." + path)], [f for f in flags if f.rpartition(".")[2] == leaf]):
        if 0 < len(found) <= 3:
            return " (did you mean " + " or ".join(repr("--" + f) for f in found) + "?)"
    candidates = ["--" + f for f in flags]
    return did_you_mean("--" + path, candidates) or did_you_mean("--" + here, candidates)


def all_flag_paths(root: type = TrainConfig, prefix: str = "") -> list[str]:
    """Every leaf flag path, for --help and suggestions."""
    out: list[str] = []
    for name, tp in (fields_of(root) or {}).items():
        path = f"{prefix}{name}"
        if fields_of(tp) is not None:
            out.extend(all_flag_paths(tp, path + "."))
        else:
            out.append(path)
    return out


def _is_textual(tp: Any) -> bool:
    tp = unwrap_optional(tp)
    if tp in (str, Path):
        return True
    if typing.get_origin(tp) is Literal:
        return all(isinstance(a, str) for a in typing.get_args(tp))
    return False


def _decode(raw: str, tp: Any) -> Any:
    if raw in ("null", "None"):
        return None
    if _is_textual(tp):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _set(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[path[-1]] = value


_NOT_A_TRAIN_CONFIG = {
    "config.json": "the policy's config.json (for --policy.path)",
    "training_step.json": "a checkpoint's training state",
    "run.json": "a run's status file",
    "checksums.json": "a checkpoint's checksums",
    "adapter_config.json": "the LoRA adapter's config",
    "adapter_base.json": "the LoRA adapter's record of its base model",
    "metrics.jsonl": "a run's metrics",
}
"""Files lr writes beside a train_config.json, which `--config_path` may name by mistake."""


def _last_checkpoint(checkpoints: Path, config_path: str) -> Path:
    """`<run>/checkpoints/last`'s train_config.json, or a ConfigError: a resume continues from it."""
    found = last_train_config(checkpoints)
    if not found.exists():
        raise ConfigError(
            f"--config_path: {config_path} has no checkpoint to resume ({checkpoints / LAST} does not name a saved step); "
            f"pass one of the step folders in {checkpoints}"
        )
    return found


def _refuse_the_exported_model(path: Path, config_path: str) -> None:
    """A resume of `<run>/pretrained_model` (the folder a run prints as "model in ..."): it holds
    the final weights, not the optimizer, RNG and data position a resume needs."""
    folder = Path(os.path.abspath(path.parent if path.name == TRAIN_CONFIG else path))
    run = folder.parent  # a step folder's pretrained_model/ is a checkpoint: its parent is in checkpoints/
    if folder.name == PRETRAINED and (run / CHECKPOINTS).is_dir() and run.parent.name != CHECKPOINTS:
        raise ConfigError(
            f"--config_path: {config_path} is the run's exported model (its final weights, written at the end), not a "
            f"checkpoint: it has no optimizer, RNG or data position to resume; resume the run with "
            f"--config_path={run / CHECKPOINTS / LAST}"
        )


def _config_file(config_path: str, *, resume: bool = False) -> Path:
    """The train_config.json that `--config_path` names, or a ConfigError saying what it is
    instead. A run folder (for a resume) or its checkpoints/ folder means the `last` checkpoint."""
    path = Path(config_path)
    if resume:
        _refuse_the_exported_model(path, config_path)
    if path.is_symlink() and not path.exists():
        raise ConfigError(
            f"--config_path: {config_path} is a link to {os.readlink(path)!r}, which does not exist; "
            "pass one of the checkpoint folders next to it"
        )
    if path.is_dir():
        if Path(os.path.abspath(path)).name == CHECKPOINTS and not (path / TRAIN_CONFIG).exists():  # `.` in there too
            return _last_checkpoint(path, config_path)
        if resume and (path / CHECKPOINTS).is_dir():  # a run folder: its own train_config.json is no checkpoint
            return _last_checkpoint(path / CHECKPOINTS, config_path)
        # a run folder, a checkpoint step folder (or `last`), or its pretrained_model/
        inside = [path / TRAIN_CONFIG, StepFiles(path).train_config]
        found = next((p for p in inside if p.exists()), None)
        if found is None:
            raise ConfigError(
                f"--config_path: {config_path} is a folder without {TRAIN_CONFIG} (nor {PRETRAINED}/{TRAIN_CONFIG}); "
                "pass a train_config.json or a checkpoint folder"
            )
        return found
    if not path.exists():
        raise ConfigError(f"--config_path: {config_path} does not exist (expected a train_config.json or a checkpoint folder)")
    return path


def _load_config_file(path: Path, config_path: str) -> TrainConfig:
    """The TrainConfig in `path`; a file that is not one, under the name of another file lr
    writes (a preset may be called config.json and load fine), is named for what it is."""
    try:
        return load_train_config(path)
    except ConfigError:
        if path.name not in _NOT_A_TRAIN_CONFIG:
            raise
    beside = path.parent / TRAIN_CONFIG
    instead = f"pass {beside}" if beside.exists() else "pass a train_config.json"
    raise ConfigError(f"--config_path: {config_path} is {_NOT_A_TRAIN_CONFIG[path.name]}, not a train_config.json; {instead} or a checkpoint folder")


def _base_dict(config_path: str | None, *, resume: bool = False) -> dict[str, Any]:
    if config_path is None:
        return to_dict(TrainConfig())
    path = _config_file(config_path, resume=resume)
    cfg = _load_config_file(path, config_path)
    data = to_dict(cfg)
    data["config_path"] = str(path)
    # resuming, a dry run and its process count are requests made by this command, not settings
    # a file passes on (module docstring)
    data.update(resume=False, dry_run=False, world_size=None)
    return data


_WHERE_THE_POLICY_GOES = ("device", "path", "pretrained_revision", "repo_id", "push_to_hub", "private", "license")
"""Where this run puts and publishes the policy: kept when the policy block is swapped (a new
--policy.type, or --policy.path's config.json)."""


def _switch_policy_type(base: dict[str, Any], new_type: str, *, fresh: bool) -> None:
    """`fresh`: the type's own defaults even when the base already has this type (without a
    --config_path the base is the demo preset, and --policy.type=act means LeRobot's defaults)."""
    types_ = policy_types()
    if new_type not in types_:
        raise ConfigError(
            f"--policy.type: unknown policy type {new_type!r}{did_you_mean(new_type, types_)}; "
            f"known types: {', '.join(types_)}"
        )
    if fresh or base["policy"].get("type") != new_type:
        keep = {k: base["policy"][k] for k in _WHERE_THE_POLICY_GOES if k in base["policy"]}
        block = to_dict(types_[new_type]())
        block["type"] = new_type
        block.update(keep)
        base["policy"] = block


def _start_from_policy_path(base: dict[str, Any], flags: dict[str, str]) -> None:
    """`--policy.path=<folder>`: the policy block becomes the saved policy's config.json (its
    type included), before the other `--policy.*` flags are merged over it."""
    if flags["policy.path"].strip() in ("", "null", "None"):
        return
    if base["policy"].get("path") == flags["policy.path"]:
        return  # the file's policy settings already started from this path (config_to_flags gives it so)
    saved = load_policy_config(Path(flags["policy.path"]))
    if "policy.type" in flags and flags["policy.type"] != saved.type_name:
        raise ConfigError(
            f"--policy.path: {flags['policy.path']} holds a {saved.type_name!r} policy, but --policy.type is "
            f"{flags['policy.type']!r}; drop --policy.type (the path sets it)"
        )
    policy = {"type": saved.type_name, **to_dict(saved)}
    policy.update({k: base["policy"][k] for k in _WHERE_THE_POLICY_GOES if k in base["policy"]})
    base["policy"] = policy


def parse_train_config(argv: list[str]) -> TrainConfig:
    """Build a TrainConfig from `--a.b=value` flags (see the module docstring)."""
    flags = split_flags(argv)
    resuming = flags.get("resume", "").strip().lower() == "true" and "config_path" in flags
    base = _base_dict(flags.get("config_path"), resume=resuming)
    dataset_before = (base["dataset"]["repo_id"], base["dataset"]["root"])
    if "policy.type" in flags:
        _switch_policy_type(base, flags["policy.type"], fresh="config_path" not in flags)
    if "policy.path" in flags and not resuming:  # a resume keeps its checkpoint's policy settings
        _start_from_policy_path(base, flags)
    for name, raw in flags.items():
        tp = _type_at(TrainConfig, name)
        if fields_of(tp) is not None:
            children = ", ".join(f"--{name}.{child}" for child in list(fields_of(tp) or {})[:4])
            raise ConfigError(f"--{name}: is a group of settings, not a value; set one of its flags ({children}, ...)")
        if name in ("config_path", "policy.type"):
            continue
        _set(base, name.split("."), _decode(raw, tp))
    if "policy.type" in flags:
        base["policy"]["type"] = flags["policy.type"]
    if "config_path" in flags:
        _follow_a_new_dataset(base, flags, dataset_before)
    if base.get("resume") is True and "output_dir" not in flags and base.get("config_path"):
        config_file = Path(base["config_path"])
        run = run_folder_of(config_file)
        if run is not None:
            base["output_dir"] = str(run)
        elif config_file.parent.name == PRETRAINED:
            raise ConfigError(
                f"--output_dir: the checkpoint {config_file.parent.parent} is not inside a run's checkpoints/ folder, so "
                f"the run folder to continue is unknown (the output_dir saved in it, {base.get('output_dir')}, may be stale); "
                "pass --output_dir"
            )
    return from_dict(TrainConfig, base, source="flags")


def _follow_a_new_dataset(base: dict[str, Any], flags: dict[str, str], before: tuple[Any, Any]) -> None:
    """A file's dataset settings hold the folder the run found its dataset in (`root`) and the
    policy's features read from it: a new `--dataset.repo_id` must not train on the old folder,
    and a new dataset gives the policy its own features, unless flags (or --policy.path's
    saved policy, or the checkpoint a resume continues) set them."""
    dataset = base["dataset"]
    if "dataset.repo_id" in flags and "dataset.root" not in flags and dataset["repo_id"] != before[0]:
        dataset["root"] = None
    if (dataset["repo_id"], dataset["root"]) == before or base["policy"].get("path") not in (None, "") or base.get("resume") is True:
        return  # a resume keeps the features its checkpoint's weights were built for
    for name in ("input_features", "output_features"):
        if not any(flag == f"policy.{name}" or flag.startswith(f"policy.{name}.") for flag in flags):
            base["policy"][name] = None


def _type_name(tp: Any) -> str:
    tp_u = unwrap_optional(tp)
    optional = tp_u is not tp
    if typing.get_origin(tp_u) is Literal:
        name = "|".join(str(a) for a in typing.get_args(tp_u))
    elif typing.get_origin(tp_u) in (list, dict):
        name = repr(tp_u).replace("typing.", "").replace("lr_config._configs.", "")
    else:
        name = getattr(tp_u, "__name__", repr(tp_u))
    return name + (" | null" if optional else "")


def _leaf_docs(root: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    rows: list[tuple[str, str, str, str]] = []
    classes = policy_classes(root)
    if classes is not None:
        rows.append((f"{prefix}type", "|".join(cls.type_name for cls in classes), json.dumps("act"), "Policy type; selects the fields below."))
        seen: set[str] = set()
        for cls in classes:
            for row in _leaf_docs(cls, prefix):
                if row[0] not in seen:
                    seen.add(row[0])
                    rows.append((row[0], row[1], row[2], f"[{cls.type_name}] {row[3]}" if row[0].split(".")[-1] not in {f.name for f in dataclasses.fields(PolicyConfigBase)} else row[3]))
        return rows
    h = hints(root)
    default_obj = root()
    for f in dataclasses.fields(root):
        path = f"{prefix}{f.name}"
        text = f.metadata.get("doc", "")
        if fields_of(h[f.name]) is not None:
            rows.extend(_leaf_docs(unwrap_optional(h[f.name]), path + "."))
            continue
        value = getattr(default_obj, f.name)
        rows.append((path, _type_name(h[f.name]), json.dumps(to_dict_value(value)), text))
    return rows


def to_dict_value(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    if isinstance(value, dict):
        return {k: to_dict_value(v) for k, v in value.items()}
    return value


def format_help(prog: str = "lr-engine train") -> str:
    """Every flag with its type, default and one line of doc."""
    lines = [
        f"usage: {prog} [--name=value ...]",
        "",
        "Values are JSON where they parse (numbers, true/false, null, lists) and text otherwise.",
        "--config_path=FILE starts from a saved train_config.json; other flags override it.",
        "",
    ]
    rows = _leaf_docs(TrainConfig)
    for path, type_name, default, text in rows:
        lines.append(f"  --{path}  {type_name}  (default: {default})")
        lines.append(f"      {text}")
    return "\n".join(lines)
