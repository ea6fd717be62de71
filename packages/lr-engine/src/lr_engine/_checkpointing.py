"""The engine's side of checkpoints, resume, the final model and publishing.

Every function here is called on every rank (saves, loads and gathers are collective);
files are written by the main rank inside lr-checkpoint / lr-publish. Resume is two-phase:
`read_resume` + `restore_rng_or_warn` before wrapping, `load_state` after it.
"""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lr_checkpoint import (
    ResumeState,
    SaveRequest,
    gather_model_state_dict,
    load_model_and_optimizer,
    pending_save,
    read_resume_state,
    resolve_step_dir,
    restore_rng,
    save_checkpoint,
    wait_for_pending_save,
    wait_for_staging,
    write_tensor_dict,
)
from lr_config import ConfigError, TrainConfig, TrainingStep, load_train_config, save_policy_config, policy_config_dict, resume_problems, save_json, to_dict
from lr_config.layout import ADAPTER_WEIGHTS, CHECKPOINTS, LAST, MODEL_WEIGHTS, POLICY_CONFIG, PRETRAINED, TRAIN_CONFIG, StepFiles

from ._optim import apply_hyperparameters, decay_end, lr_at
from ._parallel.dist import DistContext, barrier
from ._processors import save_processors
from ._run import Run, training_step_record
from ._setup import broadcast_object, dataset_changes

if TYPE_CHECKING:
    import torch
    from lr_config import AdapterBase

SCHEDULER_STATE_VERSION = 1
SCALER_STATE_VERSION = 2
"""scaler_state.json: torch's GradScaler state dict; version 2 adds `version` and the run's
`skipped_updates` (a file without `version` is version 1: no count, read as 0)."""


@dataclass
class Resume:
    step_dir: Path
    state: ResumeState
    saved_config: TrainConfig
    """The checkpoint's own train_config.json: the settings its state was trained with."""

    @property
    def training_step(self) -> TrainingStep:
        return self.state.training_step


def read_resume(cfg: TrainConfig) -> Resume:
    """Phase 1: which checkpoint, and its step, schedule and scaler state (no collectives)."""
    assert cfg.config_path is not None
    step_dir = resolve_step_dir(cfg.config_path)
    saved = load_train_config(StepFiles(step_dir).train_config)
    if saved.optimizer.type != cfg.optimizer.type:
        raise ConfigError(
            f"--optimizer.type: {step_dir} holds the state of a {saved.optimizer.type} optimizer, which cannot continue as "
            f"{cfg.optimizer.type}; resume with --optimizer.type={saved.optimizer.type}, or start a new run from its weights "
            f"with --policy.path={StepFiles(step_dir).pretrained}"
        )
    if saved.policy.dtype != cfg.policy.dtype:
        raise ConfigError(
            f"--policy.dtype: {step_dir} holds {saved.policy.dtype} weights and optimizer state, which a resume continues as they "
            f"are; resume with --policy.dtype={saved.policy.dtype}, or start a new run from its weights with "
            f"--policy.path={StepFiles(step_dir).pretrained} --policy.dtype={cfg.policy.dtype}"
        )
    return Resume(step_dir=step_dir, state=read_resume_state(step_dir), saved_config=saved)


def check_steps_continue(cfg: TrainConfig, saved_step: int) -> None:
    """Refuse a resume that would train nothing or whose first update would apply a partial
    accumulation (lr_config.resume_problems, which lr-tui's resume commands check too)."""
    problems = resume_problems(saved_step, cfg)
    if problems:
        raise ConfigError(problems[0], problems=problems)


def restore_rng_or_warn(resume: Resume, ctx: DistContext) -> None:
    """Phase 1: this rank's generators. A rank the checkpoint has no state for (it was saved by
    fewer processes) keeps its fresh seed; the main rank says which ranks, once."""
    saved_world = resume.training_step.topology.world_size
    restored = restore_rng(resume.step_dir, ctx.rank)
    if ctx.is_main and ctx.world_size > saved_world:
        fresh = f"rank {saved_world} keeps" if ctx.world_size == saved_world + 1 else f"ranks {saved_world}-{ctx.world_size - 1} keep"
        print(
            f"warning: {resume.step_dir} holds RNG state for {saved_world} process{'es' if saved_world > 1 else ''}, not "
            f"{ctx.world_size}: {fresh} a fresh seed (their random draws, dropout for one, differ from a run on "
            f"{saved_world})",
            flush=True,
        )
    if not restored and ctx.rank < saved_world:  # the file lacks a rank that saved it
        print(f"warning: {resume.step_dir} has no RNG state for rank {ctx.rank}; this rank keeps a fresh seed", flush=True)


def adapter_base(cfg: TrainConfig, ctx: DistContext, resume: Resume | None) -> AdapterBase | None:
    """LoRA: the identity of the base at --policy.path (None without PEFT), taken by the main rank
    (collective). On resume, a base whose weights differ from the ones the checkpoint's adapters
    were trained on is refused on every rank, naming --policy.path; a checkpoint saved before
    lr recorded its base resumes with a warning."""
    if cfg.peft.method_type is None:
        return None
    outcome: tuple[AdapterBase | None, str] | None = None
    if ctx.is_main:
        try:
            outcome = (_checked_base(cfg, resume), "")
        except ConfigError as exc:
            outcome = (None, str(exc))
    record: AdapterBase | None
    record, problem = broadcast_object(outcome, ctx)
    if problem:
        raise ConfigError(problem)
    return record


def _checked_base(cfg: TrainConfig, resume: Resume | None) -> AdapterBase:
    from ._adapters import ADAPTER_BASE, base_record, read_base_record

    assert cfg.policy.path is not None
    current = base_record(cfg.policy.path)
    if resume is None:
        return current
    saved = read_base_record(StepFiles(resume.step_dir).pretrained)
    if saved is None:
        print(
            f"warning: {StepFiles(resume.step_dir).pretrained} has no {ADAPTER_BASE} (saved by an older lr): cannot check that "
            f"the base at {cfg.policy.path} is the one its adapters were trained on",
            flush=True,
        )
    elif not saved.same_weights(current):
        raise ConfigError(
            f"--policy.path: the base model at {cfg.policy.path} is not the one the adapters of {resume.step_dir} were trained "
            f"on: its model.safetensors is {current.size} bytes with SHA-256 {current.sha256[:16]}..., the recorded base "
            f"({saved.base_model_name_or_path}) {saved.size} bytes with {saved.sha256[:16]}...; pass --policy.path=<the base "
            "they were trained on>"
        )
    return current


def scaler_state(run: Run) -> dict[str, Any] | None:
    """What scaler_state.json holds (fp16 runs): the GradScaler's state and the skipped updates."""
    if run.scaler is None:
        return None
    return {"version": SCALER_STATE_VERSION, **run.scaler.state_dict(), "skipped_updates": run.skipped_updates}


def _load_scaler(run: Run, resume: Resume) -> None:
    path = StepFiles(resume.step_dir).scaler
    state = dict(resume.state.scaler_state or {})
    version = state.pop("version", 1)
    skipped = state.pop("skipped_updates", 0) if version == SCALER_STATE_VERSION else 0
    if version not in (1, SCALER_STATE_VERSION):
        raise ConfigError(f"{path}: unsupported version {version!r}; expected 1 to {SCALER_STATE_VERSION}")
    if type(skipped) is not int:
        raise ConfigError(f"{path}: skipped_updates: expected int, got {skipped!r}; the checkpoint is damaged")
    if run.scaler is not None and state:
        run.scaler.load_state_dict(state)
        run.skipped_updates = skipped


def load_state(run: Run, resume: Resume) -> None:
    """Phase 2, after wrapping: weights and optimizer resharded onto this layout; the scaler."""
    load_model_and_optimizer(resume.step_dir, run.model, run.optimizer)
    apply_hyperparameters(run.optimizer, run.cfg.optimizer)  # the loaded groups hold the saved values
    sched = resume.state.scheduler_state
    if sched.get("version") != SCHEDULER_STATE_VERSION:
        raise ConfigError(f"{StepFiles(resume.step_dir).scheduler}: unsupported version {sched.get('version')!r}")
    _load_scaler(run, resume)


def changed_settings(old: TrainingStep, new: TrainingStep, old_cfg: TrainConfig | None = None, new_cfg: TrainConfig | None = None) -> list[str]:
    """What differs from the checkpoint: the layout and batch (training_step.json) and, given
    both configs, the optimizer, schedule and dataset settings (the new values apply)."""
    pairs: list[tuple[str, Any, Any]] = [
        ("batch_size", old.batch_size, new.batch_size),
        ("grad_accum", old.grad_accum, new.grad_accum),
        ("dp_world_size", old.dp_world_size, new.dp_world_size),
        ("world_size", old.topology.world_size, new.topology.world_size),
        ("layout", old.topology.layout, new.topology.layout),
        ("nodes", old.topology.nnodes, new.topology.nnodes),
        ("precision", old.precision, new.precision),
        ("seed", old.seed, new.seed),
    ]
    if old_cfg is not None and new_cfg is not None:
        if schedule_end(old_cfg) != schedule_end(new_cfg):  # the decay spans --steps: a new --steps reshapes it
            pairs.append(("steps", old_cfg.steps, new_cfg.steps))
        for group in ("optimizer", "scheduler", "dataset"):
            before, after = to_dict(getattr(old_cfg, group)), to_dict(getattr(new_cfg, group))
            pairs += [(f"{group}.{key}", before[key], after[key]) for key in after if key in before]
    return [f"{name} {a} -> {b}" for name, a, b in pairs if a != b]


def schedule_end(cfg: TrainConfig) -> int | None:
    """The loop step a decaying LR schedule ends at (None for a constant one)."""
    return None if cfg.scheduler.type == "constant" else decay_end(cfg.steps, cfg.scheduler)


def schedule_warning(old: TrainConfig, new: TrainConfig, step: int) -> str | None:
    """The warning for a resume whose new --steps moves the end of the LR decay, with the LR at
    the resumed step under both schedules and the flag that keeps the checkpoint's."""
    if schedule_end(old) == schedule_end(new) or old.steps == new.steps:
        return None
    before = lr_at(step, old.steps, old.optimizer, old.scheduler)
    after = lr_at(step, new.steps, new.optimizer, new.scheduler)
    keep = decay_end(old.steps, old.scheduler)
    final = new.optimizer.lr * new.scheduler.min_lr_ratio
    return (
        f"warning: --steps {old.steps} -> {new.steps} changes the learning-rate schedule (its {new.scheduler.type} decay ends at "
        f"--steps): the lr at step {step} was {before:.2e} and is now {after:.2e}. To keep the checkpoint's schedule and train on "
        f"at its final lr ({final:.2e}) after step {keep}, add --scheduler.decay_steps={keep}"
    )


def warn_changed_settings(run: Run, resume: Resume) -> None:
    changes = changed_settings(resume.training_step, training_step_record(run, run.start_step), resume.saved_config, run.cfg)
    if changes and run.ctx.is_main:
        if run.data.exact_position:
            exact = "exact"
        elif resume.training_step.seed != run.cfg.seed:
            exact = "not sample-exact (the data order follows --seed): continuing at the same epoch and offset in the new order"
        elif dataset_changes(resume.saved_config.dataset, run.cfg.dataset):
            exact = ("not sample-exact (another dataset, or its folder moved): continuing at the same epoch and offset of its "
                     "order, or the next epoch")
        else:
            exact = "not sample-exact (batch_size x dp_world_size changed): continuing at the same epoch, next step boundary"
        print(f"warning: resuming {resume.step_dir} with changed settings: {', '.join(changes)}; data position {exact}", flush=True)
        schedule = schedule_warning(resume.saved_config, run.cfg, run.start_step)
        if schedule is not None:
            print(schedule, flush=True)


def _write_pretrained_extras(run: Run, base_record: bool = True) -> Any:
    """The writer of a pretrained_model folder's files besides the weights (main rank). LoRA:
    the adapter config and, unless `base_record=False` (a publish folder: the record is for
    resuming here), adapter_base.json."""
    def write(directory: Path) -> None:
        save_policy_config(directory, run.cfg.policy)
        save_processors(directory, run.data.pre, run.data.post)
        if run.cfg.peft.method_type is not None:
            from ._adapters import write_adapter_config, write_base_record

            assert run.cfg.policy.path is not None and run.base_record is not None
            write_adapter_config(directory, run.policy, run.cfg.policy.path)
            if base_record:
                write_base_record(directory, run.base_record)

    return write


def trainable_names(run: Run) -> set[str]:
    """The trainable parameters' names as the gathered state dict spells them: from the policy,
    not the wrapper (DDP's names carry a `module.` prefix that the state dict drops)."""
    return {name for name, p in run.policy.named_parameters() if p.requires_grad}


def scheduler_state(run: Run, step: int) -> dict[str, Any]:
    return {"version": SCHEDULER_STATE_VERSION, "type": run.cfg.scheduler.type, "last_step": step}


def save(run: Run, step: int, training_step: TrainingStep) -> Path:
    request = SaveRequest(
        model=run.model,
        optimizer=run.optimizer,
        train_config=run.cfg,
        training_step=training_step,
        scheduler_state=scheduler_state(run, step),
        scaler_state=scaler_state(run),
        write_pretrained=_write_pretrained_extras(run),
    )
    finish_pending(run)  # the previous background save, committed first (save_checkpoint would wait too)
    try:
        path = save_checkpoint(run.output_dir / CHECKPOINTS, step, request)
    except BaseException as exc:
        _report_failure(run, f"step {step}", exc)
        raise
    if run.ctx.is_main:
        if pending_save() == path:  # an async save: "saved" is printed once it is committed
            print(f"checkpoint saving in the background: {path}", flush=True)
        else:
            print(f"checkpoint saved: {path}", flush=True)
    return path


def _report_failure(run: Run, what: str, exc: BaseException) -> None:
    if run.ctx.is_main:
        last = run.output_dir / CHECKPOINTS / LAST
        kept = f"last still -> {os.readlink(last)}" if last.is_symlink() else "no earlier checkpoint"
        print(f"checkpoint failed: {run.output_dir / CHECKPOINTS} {what}: {type(exc).__name__}: {exc}; {kept}", flush=True)


def finish_pending(run: Run) -> None:
    """Wait until a background save is committed (before the next save and before exiting);
    the main rank says so, or says it failed."""
    writing = pending_save()
    try:
        committed = wait_for_pending_save()
    except BaseException as exc:
        _report_failure(run, f"background save of {writing.name if writing else 'a step'}", exc)
        raise
    if committed is not None and run.ctx.is_main:
        print(f"checkpoint saved: {committed}", flush=True)


def wait_for_background_copy() -> None:
    """Before an optimizer step: a background save's copy of the state must be done; its
    writes and commit go on behind the training."""
    wait_for_staging()


def write_final_model(run: Run) -> dict[str, torch.Tensor]:
    """Gather the full weights (collective); the main rank writes output_dir/pretrained_model atomically.
    Returns the gathered state (the main rank's; {} elsewhere), so that a publish does not gather again."""
    gathered = gather_model_state_dict(run.model)
    state = gathered
    if run.ctx.is_main:
        final = run.output_dir / PRETRAINED
        tmp = run.output_dir / f".{PRETRAINED}.tmp-{secrets.token_hex(4)}"
        tmp.mkdir()  # not mkdtemp: its 0700 would stay on pretrained_model/ (a plain mkdir gets the umask's mode)
        name = MODEL_WEIGHTS
        if run.cfg.peft.method_type is not None:
            keep = trainable_names(run)
            state = {k: v for k, v in state.items() if k in keep}
            if not state:  # never write an empty adapter that claims to be the trained model
                raise RuntimeError(f"no trainable tensor of {sorted(keep)[:3]}... found in the gathered state dict")
            name = ADAPTER_WEIGHTS
        write_tensor_dict(tmp / name, state)
        _write_pretrained_extras(run)(tmp)
        save_json(tmp / TRAIN_CONFIG, to_dict(run.cfg))
        old = run.output_dir / f".{PRETRAINED}.old"
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    barrier()
    return gathered


def publish(run: Run, step: int, state: dict[str, torch.Tensor]) -> None:
    """Push the trained model as it is at loop step `step` (the last one run: earlier than
    --steps after a stop), so that the card and training_step.json say where it stopped;
    `state` is what `write_final_model` gathered (the main rank's), not gathered again."""
    from lr_publish import default_publish_folder, publish_trained_model

    cfg = run.cfg
    assert cfg.policy.repo_id is not None
    url = publish_trained_model(
        run.model,
        state_dict=state,
        train_config=cfg,
        training_step=training_step_record(run, step),
        write_pretrained=_write_pretrained_extras(run, base_record=False),
        repo_id=cfg.policy.repo_id,
        private=cfg.policy.private,
        endpoint=cfg.hub.endpoint,
        revision=cfg.hub.revision,
        folder=default_publish_folder(run.output_dir, cfg.policy.repo_id, step),
    )
    if url is not None and run.ctx.is_main:
        print(f"Model pushed to {url}", flush=True)


def pushes(cfg: TrainConfig) -> bool:
    """Whether the run publishes at the end: a --policy.repo_id, unless --policy.push_to_hub=false (as LeRobot)."""
    return cfg.policy.push_to_hub and cfg.policy.repo_id is not None


def publish_plan(cfg: TrainConfig) -> str:
    """The banner's one line about publishing."""
    if pushes(cfg):
        return f"publish: the trained model goes to the Hub as {cfg.policy.repo_id} at the end (--policy.push_to_hub=false keeps it local)"
    if cfg.policy.repo_id is not None:
        return f"publish: not pushing to {cfg.policy.repo_id} (--policy.push_to_hub=false)"
    return "publish: not pushing (no --policy.repo_id; give one to publish the trained model at the end)"


def check_publish(cfg: TrainConfig) -> None:
    """Before training: a bad repo id or a missing token fails now, not after hours."""
    if pushes(cfg):
        from lr_publish import check_publish_settings

        assert cfg.policy.repo_id is not None
        check_publish_settings(cfg.policy.repo_id, flag="--policy.repo_id")
