"""The Launch view: a form that builds, checks and runs an `lr-engine train` launch.

On every change the form is evaluated by `launch_form.evaluate` (lr-config does all the
work): the command preview, the effective batch and the problem lines next to the fields
they name update at once. The plan (`lr-engine train --dry_run=true --world_size=N ...`)
runs as a subprocess in an exclusive worker, debounced, so typing never waits for it; a
newer plan cancels (and kills) an older one. Run starts the command detached and posts
`LaunchView.Launched` with the run folder; it refuses a folder where a run still runs, and
(unless the command resumes) one that already holds a run, as `lr-engine train` would. In
Slurm mode Run writes `<output dir>/train.slurm`, never over an existing one.

A new `--config_path=FILE` typed in "more flags" (or a `--resume=true` added to it) refills
the setting fields from FILE, as Load preset does: each filled-in field is emitted as a
flag, so stale field values would silently override the file. A field the user changed
(from what the form last set it to: the defaults, a preset, an earlier fill) keeps its value
and overrides FILE, as does a field changed afterwards; the note under the command says so.

The command shown is the one that runs (`cli_tasks.launch_argv`: the launcher at this
environment's path), and ctrl+y copies it (`clipboard.copy_text`, which says when the
terminal cannot take it). While the plan runs, its panel counts the seconds.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Input, Static

from lr_config import (
    ConfigError,
    LaunchSpec,
    TrainConfig,
    holds_a_run,
    load_train_config,
    load_training_step,
    save_json,
    to_dict,
)
from lr_config.layout import StepFiles

from .._cli_tasks import plan_argv, run_streaming, start_training
from .._dataset_info import DatasetInfo, dataset_info
from .._clipboard import copy_text
from .._keymap import LAUNCH_BINDINGS
from .._launch_form import (
    FIELDS,
    GENERAL,
    LaunchPlan,
    config_file,
    default_output_dir,
    default_values,
    evaluate,
    filled_from_file,
    values_from_config,
)
from .._run_state import run_liveness
from .._screens.prompt import TextPrompt
from .._widgets.choice import Choice
from .._widgets.form_row import FormRow
from .._widgets.text_panel import TextPanel

__all__ = ["LaunchView", "PlanRunner", "run_plan"]

PlanRunner = Callable[[list[str]], Awaitable[tuple[int, str]]]
"""Runs a dry-run argv; returns (exit code, output)."""

SLURM_SCRIPT = "train.slurm"


def slurm_script_name(cfg: TrainConfig) -> str:
    """`train.slurm` for a new run; a resume continues in the run folder, which has one already
    (never written over): `train.resume-<step>.slurm`, named for the checkpoint it resumes."""
    if not cfg.resume or cfg.config_path is None:
        return SLURM_SCRIPT
    files = StepFiles.of_train_config(Path(cfg.config_path))
    try:
        step = f"{load_training_step(files.training_step).step:06d}"
    except ConfigError:  # the plan refused such a checkpoint already; a name all the same
        step = files.root.resolve().name
    return f"train.resume-{step}.slurm"


async def run_plan(argv: list[str]) -> tuple[int, str]:
    lines: list[str] = []
    code = await run_streaming(argv, lines.append)
    return code, "\n".join(lines)


class LaunchView(Horizontal):
    BINDINGS = LAUNCH_BINDINGS

    class Launched(Message):
        """A training run was started (or a Slurm script written) for `output_dir`."""

        def __init__(self, output_dir: Path, process: subprocess.Popen[bytes] | None) -> None:
            super().__init__()
            self.output_dir = output_dir
            self.process = process

    def __init__(
        self, *, plan_runner: PlanRunner | None = run_plan, plan_delay: float = 0.5, stop_grace: float = 30.0, id: str | None = None
    ) -> None:
        super().__init__(id=id)
        self.plan_runner = plan_runner
        self.plan_delay = plan_delay
        self.stop_grace = stop_grace
        self._defaults = default_values()
        self.plan: LaunchPlan = evaluate(self._defaults)
        self._plan_flags: list[str] | None = None
        self._plan_timer: Timer | None = None
        self._rows: dict[str, FormRow] = {}
        self._refresh_queued = False
        self._filled_from: tuple[str, bool] | None = None
        """The (`--config_path`, resume) the fields were last filled from."""
        self._dataset_key: tuple[str, Path | None, str | None] | None = None
        self._dataset = DatasetInfo([], [])
        self._baseline: dict[str, str] = dict(self._defaults)
        """What the form last set each field to (defaults, a preset, a fill from a file, a fresh
        output dir): a field holding something else was changed by the user."""

    def compose(self) -> ComposeResult:
        values = self._defaults
        with VerticalScroll(id="launch-form") as form:
            form.border_title = "settings"
            for field in FIELDS:
                yield FormRow(field, values[field.key])
                if field.key == "dataset_root":
                    yield Static("", id="dataset-info", markup=False)
                    yield Static("", id="dataset-problems", markup=False)
        with Vertical(id="launch-side"):
            yield TextPanel("command", id="preview")
            yield Static("", id="notes", markup=False)
            yield Static("", id="batch", markup=False)
            yield Static("", id="policy-flags", markup=False)
            yield Static("", id="general-problems", markup=False)
            yield TextPanel("plan: lr-engine train --dry_run=true", id="plan")

    def on_mount(self) -> None:
        self._rows = {row.field.key: row for row in self.query(FormRow)}
        self.refresh_plan()

    @property
    def rows(self) -> dict[str, FormRow]:
        return self._rows

    def values(self) -> dict[str, str]:
        return {key: row.value for key, row in self.rows.items()}

    def set_values(self, values: dict[str, str]) -> None:
        for key, row in self.rows.items():
            row.set_value(values.get(key, ""))
        self._baseline = {key: values.get(key, "") for key in self.rows}
        self.refresh_plan()

    def changed_by_user(self) -> frozenset[str]:
        """The fields whose value is not the one the form last set (the user typed it)."""
        return frozenset(key for key, row in self.rows.items() if row.value != self._baseline.get(key, ""))

    def on_input_changed(self, event: Input.Changed) -> None:
        self._refresh_soon()

    def on_choice_changed(self, event: Choice.Changed) -> None:
        self._refresh_soon()

    def _refresh_soon(self) -> None:
        """One evaluation for a burst of changes (the fields' first values as they mount, a
        preset, fast typing): evaluating parses and validates the whole config."""
        if not self._refresh_queued:
            self._refresh_queued = True
            self.call_later(self._queued_refresh)

    def _queued_refresh(self) -> None:
        self._refresh_queued = False
        self.refresh_plan()

    def refresh_plan(self) -> None:
        """Re-evaluate the form and show the result; schedule the dry-run plan."""
        plan = self.plan = evaluate(self._fill_from_config_path(self.values()))
        for key, row in self.rows.items():
            row.show_problems(plan.problems.get(key, []), marked=key in plan.marked)
        title = "Slurm script" if plan.mode == "slurm" else "command"
        preview = self.query_one("#preview", TextPanel)
        preview.border_title = title
        if plan.ok:
            preview.show(plan.preview, subtitle="ctrl+y copies")
        else:
            count = sum(len(v) for v in plan.problems.values())
            where = ", ".join(plan.fields_with_problems())
            preview.show(f"{count} problem{'s' if count != 1 else ''} in the settings; see {where}", error=True)
        self._update_static("#notes", "\n".join(plan.notes))
        self._update_static("#batch", plan.batch_line())
        self._update_static("#policy-flags", plan.policy_line())
        self._show_dataset(plan)
        self._update_static("#general-problems", "\n".join(plan.problems.get(GENERAL, [])))
        self._schedule_dry_run(plan)

    def _fill_from_config_path(self, values: dict[str, str]) -> dict[str, str]:
        """Refill the setting fields from a new `--config_path` of "more flags" (module
        docstring); the values the form then holds."""
        source = config_file(values)
        if source is None or source.key == self._filled_from:
            return values
        self._filled_from = source.key
        kept = self.changed_by_user() - {"extra"}
        filled = filled_from_file(values, source, keep=kept)
        for key, row in self.rows.items():
            if row.value != filled[key]:
                row.set_value(filled[key])
            if key not in kept:
                self._baseline[key] = filled[key]
        plain = filled_from_file(values, source)
        labels = [row.field.label for key, row in self.rows.items() if key in kept and filled[key] != plain[key]]
        self.notify(f"Fields filled from {source.path}" + (f"; kept yours: {', '.join(labels)}" if labels else ""))
        return filled

    def _show_dataset(self, plan: LaunchPlan) -> None:
        """Where the chosen dataset is and what it holds (`_dataset_info`: meta/info.json only),
        read again only when the dataset settings change."""
        if plan.cfg is not None:
            data = plan.cfg.dataset
            key: tuple[str, Path | None, str | None] = (data.repo_id, data.root, data.revision)
        else:
            root = self.rows["dataset_root"].value.strip()
            key = (self.rows["dataset_repo_id"].value.strip(), Path(root) if root else None, None)
        if key != self._dataset_key:
            self._dataset_key = key
            self._dataset = dataset_info(*key)
        self._update_static("#dataset-info", "\n".join(self._dataset.lines))
        self._update_static("#dataset-problems", "\n".join(self._dataset.problems))

    def _update_static(self, selector: str, text: str) -> None:
        """Update only on change: every update of an auto-height widget costs a layout."""
        static = self.query_one(selector, Static)
        if str(static.content) != text:
            static.update(text)
        static.display = bool(text)

    def _schedule_dry_run(self, plan: LaunchPlan) -> None:
        flags = plan.dry_run_flags()
        if flags == self._plan_flags or self.plan_runner is None:
            return
        self._plan_flags = flags
        if self._plan_timer is not None:
            self._plan_timer.stop()
        panel = self.query_one("#plan", TextPanel)
        if flags is None:
            self.workers.cancel_group(self, "plan")
            panel.show("waiting for valid settings")
            return
        panel.show("planning ...")
        world_size = plan.spec.world_size if plan.spec else 0
        if self.plan_delay > 0:
            self._plan_timer = self.set_timer(self.plan_delay, lambda: self._dry_run(flags, world_size))
        else:
            self._dry_run(flags, world_size)

    @work(exclusive=True, group="plan")
    async def _dry_run(self, flags: list[str], world_size: int) -> None:
        """Run the plan; its panel says for how long it has been running, every second."""
        assert self.plan_runner is not None
        panel = self.query_one("#plan", TextPanel)
        started = time.monotonic()

        def tick() -> None:
            panel.set_subtitle(f"running lr-engine --dry_run: {time.monotonic() - started:.0f} s")

        tick()
        ticker = self.set_interval(1.0, tick)
        try:
            code, output = await self.plan_runner(plan_argv(flags))
        except OSError as exc:
            code, output = -1, f"could not start lr-engine: {exc}"
        finally:
            ticker.stop()
        subtitle = f"world size {world_size}" + ("" if code == 0 else f", exit {code}")
        panel.show(output or "(no output)", subtitle=subtitle, error=code != 0)

    def action_copy_command(self) -> None:
        if not self.plan.ok:
            self.notify("Fix the settings first.", severity="warning")
            return
        what = "the Slurm script" if self.plan.mode == "slurm" else "the launch command"
        copy_text(self.app, self.plan.preview, what, "the command panel")

    def _plan_with_output_dir(self) -> LaunchPlan:
        """The plan with an output dir: a fresh default one unless the settings name one (the
        field, a flag, or a resume's `--config_path`, which continues in its run folder)."""
        if self.plan.cfg is not None and self.plan.cfg.output_dir is None:
            fresh = str(default_output_dir(self.plan.cfg, datetime.now()))
            self.rows["output_dir"].set_value(fresh)
            self._baseline["output_dir"] = fresh
            self.refresh_plan()
        return self.plan

    def _unusable_output_dir(self, cfg: TrainConfig, output_dir: Path) -> str | None:
        """Why the run must not start in `output_dir`, or None: a run still running there would
        have its launch log and record taken over, and a new run would mix with a finished one."""
        if run_liveness(output_dir).alive:
            return f"Not started: a run is still running in {output_dir}. Stop it in the Monitor (x), or choose another output dir."
        if not cfg.resume and holds_a_run(output_dir):
            return f"Not started: {output_dir} already holds a run. Choose another output dir, or resume it (Monitor: r)."
        return None

    def action_run(self) -> None:
        plan = self._plan_with_output_dir()
        if not plan.ok or plan.cfg is None or plan.cfg.output_dir is None:
            self.notify("Fix the settings first.", severity="warning")
            return
        output_dir = plan.cfg.output_dir
        problem = self._unusable_output_dir(plan.cfg, output_dir)
        if problem:
            self.notify(problem, severity="error", timeout=10)
            return
        if plan.mode == "slurm":
            path = output_dir / slurm_script_name(plan.cfg)
            try:
                self._write_slurm_script(plan.preview, path)
            except FileExistsError:
                self.notify(
                    f"Not saved: {path} already exists (it may hold your edits). Remove it, or choose another output dir.",
                    severity="error",
                    timeout=10,
                )
                return
            except OSError as exc:
                self.notify(f"Could not save {path}: {exc}", severity="error", timeout=10)
                return
            self.notify(f"Saved {path}. Submit it with: sbatch {path}")
            return
        assert plan.argv is not None
        try:
            process = start_training(plan.argv, output_dir, stop_grace=self.stop_grace)
        except OSError as exc:
            self.notify(f"Could not start {plan.argv[0]}: {exc}", severity="error")
            return
        self.notify(f"Started {plan.argv[0]} (pid {process.pid}); log in {output_dir}/logs/launch.log")
        self.post_message(self.Launched(output_dir, process))

    @staticmethod
    def _write_slurm_script(script: str, path: Path) -> None:
        """Write `path` whole or not at all, and never over an existing file (FileExistsError):
        a temp file beside it, linked to its name only if that is free. Executable, with the
        mode the umask gives (0755 under 022), as every file lr writes; `logs/` is created
        too, as Slurm opens its log files there before the script runs."""
        if path.exists() or path.is_symlink():
            raise FileExistsError(f"{path} already exists")
        (path.parent / "logs").mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o777)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(script)
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, path)  # atomic, and fails if the name is taken meanwhile
        finally:
            tmp.unlink(missing_ok=True)

    def action_save_preset(self) -> None:
        cfg = self.plan.cfg
        if cfg is None:
            self.notify("Fix the settings first: the preset is the parsed TrainConfig.", severity="warning")
            return

        def check(path: str) -> str | None:
            target = Path(path)
            exists = target.exists() or target.is_symlink()
            return f"{path}: already exists; choose a new file name" if exists else None

        def save(path: str | None) -> None:
            if not path:
                return
            try:
                save_json(Path(path), to_dict(cfg))
            except OSError as exc:
                self.notify(f"Could not save the preset: {exc}", severity="error", timeout=10)
                return
            self.notify(f"Saved preset {path}")

        prompt = TextPrompt("Save the settings as a TrainConfig JSON (a new file)", "lr_preset.json", check=check)
        self.app.push_screen(prompt, save)

    def action_load_preset(self) -> None:
        def check(path: str) -> str | None:
            return None if Path(path).is_file() else f"{path}: no such file"

        def load(path: str | None) -> None:
            if not path:
                return
            try:
                cfg = load_train_config(Path(path))
                # resume and a dry run are requests of a command, never read from a file; and the file holds
                # every setting resolved, so the form needs no older file it was built on
                cfg = replace(cfg, resume=False, config_path=None, dry_run=False, world_size=None)
                # rebuilding the flags reads --policy.path's config.json, which may be gone
                values = values_from_config(cfg, self.plan.spec or LaunchSpec(), self.plan.mode)
            except ConfigError as exc:
                self.notify(str(exc), severity="error", timeout=10)
                return
            self.set_values(values)
            self.notify(f"Loaded preset {path}")

        prompt = TextPrompt("Load a TrainConfig JSON (a preset or a checkpoint's train_config.json)", "lr_preset.json", check=check)
        self.app.push_screen(prompt, load)

    def focus_main(self) -> None:
        self.query_one("#launch-form").focus()
