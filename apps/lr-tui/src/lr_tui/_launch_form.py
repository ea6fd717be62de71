"""The Launch form as data: which fields exist, and what a set of field values means.

`evaluate(values)` turns the form's text values into a `LaunchPlan`: the `LaunchSpec`, the
`TrainConfig`, the exact command preview (`format_command` of `cli_tasks.launch_argv` over
`build_launch(spec, cfg)`: the launcher at this environment's path and, once the output dir is
known, the per-rank log options; or the Slurm script), the effective-batch line, and lr-config's problem lines routed to the field
whose flag they name. It never raises and imports no torch; the view calls it on every
keystroke, so it only parses and validates.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from lr_config import (
    CHECKPOINT_FORMATS,
    POLICY_TYPES,
    ConfigError,
    LaunchSpec,
    PolicyConfigBase,
    Topology,
    TrainConfig,
    build_launch,
    build_slurm_script,
    config_to_flags,
    effective_batch,
    format_command,
    load_training_step,
    parse_train_config,
    policy_types,
    demo_preset_note,
    resolve_topology,
    resume_problems,
    split_flags,
    to_dict,
    validate,
)
from lr_config.layout import StepFiles

from ._cli_tasks import launch_argv
from ._run_list import RUNS_ROOT

__all__ = [
    "FIELDS",
    "ConfigFile",
    "FormField",
    "LaunchPlan",
    "config_file",
    "default_output_dir",
    "default_values",
    "evaluate",
    "filled_from_file",
    "route_problem",
    "values_from_config",
]

GENERAL = ""
"""Key of the problems that name no form field."""
MAIN_POLICY_FLAGS = 4
"""How many of the chosen policy's own settings the form shows beside the command."""


@dataclass(frozen=True)
class FormField:
    key: str
    label: str
    flag: str | None = None
    """The train flag path (`a.b`) this field sets; None for launcher settings."""
    options: tuple[tuple[str, str], ...] = ()
    """(label, value) choices: the field is a select when given."""
    placeholder: str = ""
    completes: str = ""
    """What the field completes as it is typed: "flags" (`--a.b=c` names), "folders", "datasets"
    (the repo ids of the datasets on this machine)."""


DEMO_PRESET_CHOICE = ("act (demo preset)", "")
"""No --policy.type: the demo preset of ACT, as `lr-engine train` without policy flags."""


def _policy_choices() -> tuple[tuple[str, str], ...]:
    """The demo preset, the built-in policy types (`act` is LeRobot's defaults), then the
    installed plugins' (`lr.policies`). A broken plugin leaves the built-ins: the form's plan
    shows its error, as `lr-engine train` would."""
    try:
        names = list(policy_types())
    except ConfigError:
        names = list(POLICY_TYPES)
    return (DEMO_PRESET_CHOICE, *((name, name) for name in names))


_LAUNCHERS = (("torchrun", "torchrun"), ("accelerate launch", "accelerate"), ("Slurm script", "slurm"))
_PRECISIONS = (("no", "no"), ("bf16", "bf16"), ("fp16", "fp16"))

FIELDS: tuple[FormField, ...] = (
    FormField("launcher", "launcher", options=_LAUNCHERS),
    FormField("nnodes", "nodes"),
    FormField("node_rank", "node rank"),
    FormField("nproc_per_node", "procs/node"),
    FormField("rdzv_endpoint", "rendezvous", placeholder="HOST:PORT of node 0"),
    FormField("policy_type", "policy type", "policy.type", _policy_choices()),
    FormField("policy_path", "policy path", "policy.path", placeholder="saved policy to fine-tune"),
    FormField("dataset_repo_id", "dataset id", "dataset.repo_id", completes="datasets"),
    FormField("dataset_root", "dataset root", "dataset.root", placeholder="local dataset folder", completes="folders"),
    FormField("steps", "steps", "steps"),
    FormField("batch_size", "batch size", "batch_size"),
    FormField("grad_accum", "grad accum", "accelerator.gradient_accumulation.steps"),
    FormField("lr", "lr", "optimizer.lr"),
    FormField("mixed_precision", "precision", "accelerator.mixed_precision", _PRECISIONS),
    FormField("dp_replicate", "dp_replicate", "parallelism.dp_replicate", placeholder="auto"),
    FormField("dp_shard", "dp_shard", "parallelism.dp_shard", placeholder="auto (-1 infers)"),
    FormField("checkpoint_format", "ckpt format", "checkpoint_format", tuple((f, f) for f in CHECKPOINT_FORMATS)),
    FormField("peft_method", "PEFT", "peft.method_type", (("none", ""), ("LoRA", "LORA"))),
    FormField("peft_r", "LoRA r", "peft.r"),
    FormField("output_dir", "output dir", "output_dir", placeholder="outputs/train/<date>/<time>_<job>"),
    FormField("extra", "more flags", placeholder="--a.b=c ...", completes="flags"),
)

_BY_KEY = {f.key: f for f in FIELDS}
_FIELD_OF_FLAG = {f.flag: f.key for f in FIELDS if f.flag}
_SPEC_FIELDS = ("nnodes", "node_rank", "nproc_per_node", "rdzv_endpoint", "launcher")
_LEADING_FLAGS = re.compile(r"^--([\w.]+)(?:=\S*)?(?:\s+(?:x|and)\s+--([\w.]+))?")


@dataclass
class LaunchPlan:
    """What the form means right now."""

    mode: str
    spec: LaunchSpec | None = None
    cfg: TrainConfig | None = None
    topology: Topology | None = None
    argv: list[str] | None = None
    """The launch argv, exactly as it runs (None in Slurm mode or when invalid)."""
    preview: str = ""
    """The exact command (or Slurm script); empty while the settings are invalid."""
    problems: dict[str, list[str]] = field(default_factory=dict)
    """Field key -> lr-config's lines for it; GENERAL for lines that name no field. A line
    naming several fields (`--parallelism.dp_replicate x --parallelism.dp_shard = ...`) is
    shown once, at the last of them; the others are only marked."""
    marked: set[str] = field(default_factory=set)
    """Fields named by a problem shown at another field."""
    notes: list[str] = field(default_factory=list)
    """Lines to show that block nothing: the fields that override a `--config_path` file."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, lines: list[str], key: str | None = None) -> None:
        """Record problem lines at `key`, or at the field(s) each line names."""
        for line in lines:
            keys = [key] if key is not None else route_problem(line)
            self.problems.setdefault(keys[-1], []).append(line)
            self.marked.update(keys[:-1])

    def fields_with_problems(self) -> list[str]:
        """Labels of the fields with problems, in form order ('settings' for general ones)."""
        keys = set(self.problems) | self.marked
        labels = [f.label for f in FIELDS if f.key in keys]
        return labels + (["settings"] if GENERAL in keys else [])

    def batch_line(self) -> str:
        """`batch 8 x dp_world 4 x grad_accum 2 = 64 effective` and the layout, or why there is none."""
        if self.cfg is None or self.topology is None:
            return "effective batch: fix the settings first"
        cfg, topo = self.cfg, self.topology
        return (
            f"batch {cfg.batch_size} x dp_world {topo.dp_world_size} x grad_accum {cfg.grad_accum_steps}"
            f" = {effective_batch(cfg, topo)} effective\n{topo.describe()}"
        )

    def policy_line(self) -> str:
        """The chosen policy's main settings (its config class's `main_flags`, else its own first `MAIN_POLICY_FLAGS` scalar fields, as
        the flags set them), for any policy type: built-in or an installed plugin's."""
        if self.cfg is None:
            return ""
        policy = self.cfg.policy
        base = {f.name for f in dataclasses.fields(PolicyConfigBase)}
        own = [f.name for f in dataclasses.fields(policy) if f.name not in base and isinstance(getattr(policy, f.name), (bool, int, float, str))]
        main = [name for name in getattr(type(policy), "main_flags", ()) if name in own] or own[:MAIN_POLICY_FLAGS]
        shown = " ".join(f"{name}={_text(getattr(policy, name))}" for name in main)
        more = len(own) - len(main)
        name = f"{policy.type_name} (demo preset)" if demo_preset_note(policy) is not None else policy.type_name
        return f"policy {name}: {shown}" + (f" (+{more} in --help)" if more > 0 else "")

    def dry_run_flags(self) -> list[str] | None:
        """`--dry_run=true --world_size=N <flags>` for `lr-engine train`, or None while invalid."""
        if self.cfg is None or self.spec is None or not self.ok:
            return None
        return ["--dry_run=true", f"--world_size={self.spec.world_size}", *config_to_flags(self.cfg)]


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, (str, Path)):
        return str(value)
    return json.dumps(value)


def _flat(data: dict[str, object], prefix: str = "") -> dict[str, object]:
    """Every setting by its dotted flag path (groups included)."""
    out: dict[str, object] = {}
    for key, value in data.items():
        out[f"{prefix}{key}"] = value
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
    return out


def _setting_values(cfg: TrainConfig) -> dict[str, str]:
    """The values of the fields that set a train flag, from `cfg`."""
    flat = _flat(to_dict(cfg))
    values = {f.key: _text(flat.get(f.flag)) for f in FIELDS if f.flag}
    if cfg.config_path is None and values["policy_type"] == "act" and "--policy.type=act" not in config_to_flags(cfg):
        values["policy_type"] = DEMO_PRESET_CHOICE[1]  # the command starts from the demo preset
    return values


def values_from_config(cfg: TrainConfig, spec: LaunchSpec | None = None, mode: str | None = None) -> dict[str, str]:
    """Field values that reproduce `cfg` (and `spec`); flags without a field go to 'more flags'."""
    spec = spec or LaunchSpec()
    values = _setting_values(cfg)
    values.update(
        launcher=mode or spec.launcher,
        nnodes=str(spec.nnodes),
        node_rank=str(spec.node_rank),
        nproc_per_node=str(spec.nproc_per_node),
        rdzv_endpoint=spec.rdzv_endpoint or "",
    )
    rest = [flag for flag in config_to_flags(cfg) if split_flag_path(flag) not in _FIELD_OF_FLAG]
    values["extra"] = shlex.join(rest)
    return values


def default_values() -> dict[str, str]:
    """The form as it opens: lr-config's defaults."""
    return values_from_config(TrainConfig())


@dataclass(frozen=True)
class ConfigFile:
    """The `--config_path=FILE` typed in "more flags", and the settings FILE gives this command."""

    path: str
    """As typed."""
    resume: bool
    """"More flags" also holds `--resume=true`: the run continues in the checkpoint's run folder."""
    cfg: TrainConfig
    """FILE's settings as the parser reads them for this command (a resume's output_dir is the
    run folder, or the output dir typed when the checkpoint is outside a run)."""
    extra_paths: frozenset[str]
    """The flag paths given in "more flags"."""
    output_dir_needed: bool = False
    """A resume of a checkpoint outside a run: the output dir field names where it continues."""

    @property
    def key(self) -> tuple[str, bool]:
        """What makes it a new file for the form: the path and whether the command resumes."""
        return self.path, self.resume


def config_file(values: dict[str, str]) -> ConfigFile | None:
    """The `--config_path` in "more flags" and the settings it holds, or None when there is
    none, or it (or "more flags") does not parse yet. Never raises."""
    try:
        flags = split_flags(shlex.split(values.get("extra", "")))
    except (ValueError, ConfigError):
        return None
    path = flags.get("config_path", "").strip()
    if not path:
        return None
    resume = flags.get("resume", "").strip().lower() == "true"
    argv = [f"--config_path={path}", *(["--resume=true"] if resume else [])]
    if "output_dir" in flags:
        argv.append(f"--output_dir={flags['output_dir']}")
    attempts = [argv]
    field_output_dir = values.get("output_dir", "").strip()
    if resume and "output_dir" not in flags and field_output_dir:
        attempts.append([*argv, f"--output_dir={field_output_dir}"])
    for attempt in attempts:
        try:
            cfg = parse_train_config(attempt)
            # the output dir field names where the resume continues, unless it holds the
            # (stale) output_dir saved in the file, as after a fill for a new run from it
            needed = attempt is not argv and str(parse_train_config([f"--config_path={path}"]).output_dir) != field_output_dir
        except ConfigError:
            continue
        except Exception:  # a file that lr-config cannot read must never take the app down
            return None
        return ConfigFile(path, resume, cfg, frozenset(flags), output_dir_needed=needed)
    return None


def filled_from_file(values: dict[str, str], source: ConfigFile, keep: frozenset[str] = frozenset()) -> dict[str, str]:
    """`values` with the setting fields taken from `source`'s file: the launcher fields, "more
    flags" and the fields in `keep` (those the user changed) stay as typed, a field whose flag
    "more flags" gives is emptied, and so is the output dir of a resume (the parser continues in
    the checkpoint's run folder, not in the output_dir saved in the file) unless the checkpoint
    is outside a run or the user gave it."""
    from_file = _setting_values(source.cfg)
    filled = dict(values)
    for f in FIELDS:
        if f.flag is None:
            continue
        if f.flag in source.extra_paths:
            filled[f.key] = ""
        elif f.key not in keep:
            filled[f.key] = from_file[f.key]
    if source.resume and "output_dir" not in keep:
        filled["output_dir"] = values.get("output_dir", "") if source.output_dir_needed else ""
    return filled


def _overrides(values: dict[str, str], cfg: TrainConfig, source: ConfigFile | None) -> list[str]:
    """`overrides FILE: --batch_size=32 (file: 8), ...`: the fields that override the
    `--config_path` file of "more flags" (`source`)."""
    if source is None:
        return []
    mine, theirs = _flat(to_dict(cfg)), _flat(to_dict(source.cfg))
    changed = [
        f"--{f.flag}={values[f.key].strip()} (file: {_text(theirs.get(f.flag)) or 'unset'})"
        for f in FIELDS
        if f.flag and values.get(f.key, "").strip() and mine.get(f.flag) != theirs.get(f.flag)
    ]
    return [f"overrides {source.path}: " + ", ".join(changed)] if changed else []


def split_flag_path(flag: str) -> str:
    return flag[2:].partition("=")[0]


def route_problem(line: str) -> list[str]:
    """Field keys a problem line belongs to, from the flag(s) it starts with."""
    match = _LEADING_FLAGS.match(line)
    if match:
        flags = [g for g in match.groups() if g]
        return sorted({_FIELD_OF_FLAG.get(flag, "extra") for flag in flags}, key=list(_BY_KEY).index)
    head = line.partition(":")[0]
    if head in _SPEC_FIELDS:
        return [head]
    return [GENERAL]


def _spec(values: dict[str, str], plan: LaunchPlan) -> LaunchSpec | None:
    numbers: dict[str, int] = {}
    defaults = LaunchSpec()
    for key in ("nnodes", "node_rank", "nproc_per_node"):
        text = values.get(key, "").strip()
        if not text:
            numbers[key] = getattr(defaults, key)
            continue
        try:
            numbers[key] = int(text)
        except ValueError:
            plan.add([f"{key}: expected an integer, got {text!r}"], key)
    if len(numbers) < 3:
        return None
    spec = LaunchSpec(
        launcher="accelerate" if values.get("launcher") == "accelerate" else "torchrun",
        nnodes=numbers["nnodes"],
        node_rank=numbers["node_rank"],
        nproc_per_node=numbers["nproc_per_node"],
        rdzv_endpoint=values.get("rdzv_endpoint", "").strip() or None,
    )
    try:
        # a Slurm script finds the head node itself: no rendezvous endpoint to give
        spec.check(require_endpoint=values.get("launcher") != "slurm")
    except ConfigError as exc:
        plan.add(exc.problems)
        return None
    return spec


def _train_flags(values: dict[str, str], plan: LaunchPlan, source: ConfigFile | None) -> list[str] | None:
    """The train flags of the fields and "more flags". Over a `--config_path` file, a field that
    holds the file's value is not given: the parser's rules for what a file's settings become
    (a new dataset id drops the saved dataset folder, a policy path restarts the policy
    settings) then apply as they do on the command line. The output dir is always given: for a
    resume it is where the run continues, which the parser takes only from the flag."""
    from_file = _setting_values(source.cfg) if source is not None else {}
    flags = [
        f"--{f.flag}={value}"
        for f in FIELDS
        if f.flag and (value := values.get(f.key, "").strip()) and (f.key == "output_dir" or value != from_file.get(f.key, "").strip())
    ]
    try:
        extra = shlex.split(values.get("extra", ""))
        extra_paths = split_flags(extra)
    except (ValueError, ConfigError) as exc:
        plan.add([f"more flags: {exc}"], "extra")
        return None
    twice = [p for p in extra_paths if p in _FIELD_OF_FLAG and values.get(_FIELD_OF_FLAG[p], "").strip()]
    for path in twice:
        label = _BY_KEY[_FIELD_OF_FLAG[path]].label
        plan.add([f"--{path}: already set by the {label!r} field; remove it here"], "extra")
    return None if twice else flags + extra


def _config(flags: list[str], plan: LaunchPlan) -> TrainConfig | None:
    try:
        return parse_train_config(flags)
    except ConfigError as exc:
        plan.add(exc.problems)
    except Exception as exc:  # half-typed flags must never take the app down
        plan.add([f"more flags: lr-config could not parse these flags ({type(exc).__name__}: {exc})"], "extra")
    return None


def _build(plan: LaunchPlan, spec: LaunchSpec, cfg: TrainConfig) -> None:
    """Validate for the launch and fill the preview (and argv), or record the problems."""
    try:
        validate(cfg, world_size=spec.world_size, nnodes=spec.nnodes)
        if plan.mode == "slurm":
            plan.preview = build_slurm_script(spec, cfg)
        else:
            plan.argv = launch_argv(build_launch(spec, cfg), cfg.output_dir)
            plan.preview = format_command(plan.argv)
    except ConfigError as exc:
        plan.add(exc.problems)


def _resume_problems(cfg: TrainConfig) -> list[str]:
    """Why the checkpoint a resume names cannot go on as `cfg` says (lr_config.resume_problems:
    no steps left, a partial first update), as the engine would refuse it at start-up."""
    if cfg.config_path is None:
        return []
    try:
        saved = load_training_step(StepFiles.of_train_config(Path(cfg.config_path)).training_step)
    except ConfigError as exc:
        return exc.problems
    return resume_problems(saved.step, cfg)


def _resolved(spec: LaunchSpec, cfg: TrainConfig) -> Topology | None:
    try:
        return resolve_topology(cfg.parallelism, spec.world_size, spec.nnodes)
    except ConfigError:
        return None


def evaluate(values: dict[str, str]) -> LaunchPlan:
    """What the form values mean (see the module docstring). Never raises."""
    plan = LaunchPlan(mode=values.get("launcher", "torchrun"))
    plan.spec = _spec(values, plan)
    source = config_file(values)  # parsed once: the flags and the notes both compare with it
    flags = _train_flags(values, plan, source)
    plan.cfg = _config(flags, plan) if flags is not None else None
    if plan.cfg is None:
        return plan
    plan.notes = _overrides(values, plan.cfg, source)
    if plan.cfg.resume:
        plan.add(_resume_problems(plan.cfg))
    if plan.spec is None:
        try:
            validate(plan.cfg)
        except ConfigError as exc:
            plan.add(exc.problems)
        return plan
    plan.topology = _resolved(plan.spec, plan.cfg)
    _build(plan, plan.spec, plan.cfg)
    return plan


def default_output_dir(cfg: TrainConfig, now: datetime) -> Path:
    """`outputs/train/<date>/<time>_<job>`, as lr-engine names a run launched without --output_dir.

    The TUI fills it in before launching, so that it knows which folder to monitor."""
    job = cfg.job_name or cfg.policy.type_name
    return RUNS_ROOT / f"{now:%Y-%m-%d}" / f"{now:%H-%M-%S}_{job}"
