"""The training loop: one code path for single process, DDP, FSDP2 and HSDP.

`train(cfg)` runs on every rank, as a short sequence of named steps (`build_run`, then
`train_loop`, the final model and the publish; see `_setup.py` for the build order).
`train_loop` iterates optimizer updates. Each `train_step` runs the K micro-batches of one
update: fetch this rank's micro-batch, normalize, forward under the layout's precision,
backward (scaled by 1/K and, for fp16, by the loss scaler); then sync ignored-module
gradients, unscale, clip, set the step's LR and update. Gradient sync is skipped on the first
K-1 micro-batches (DDP `no_sync`, FSDP2 `set_requires_gradient_sync(False)`). Steps, as the
flags, logs and files count them, are loop steps (micro-batches). The `Checkpointer`
(`_checkpointer.py`) decides at each update whether to save or stop; saves are collective
and only the main rank writes files.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from lr_config import (
    demo_preset_note,
    lerobot_optimizer_note,
    EvalAggregate,
    MetricsRecord,
    RunStatus,
    TrainConfig,
    banner_line,
    save_json,
    save_run_status,
    to_dict,
)
from lr_config.layout import CHECKPOINTS, LAST, METRICS, PRETRAINED, RUN_STATUS, TRAIN_CONFIG
from torch import nn

from . import _checkpointing as checkpointing
from . import _faults
from ._checkpointer import Checkpointer, save_steps_text
from ._data.errors import DatasetError, from_worker
from ._data.locate import one_per_node
from ._launcher import LAUNCH_COMMAND_ENV
from ._metrics import MetricsSink, MetricsWindow, keep_records_through
from ._optim import clip_and_norm, lr_at, make_optimizer, set_lr
from ._parallel.dist import DistContext
from ._parallel.precision import autocast_for, make_scaler
from ._parallel.wrap import sync_ignored_grads
from ._run import Run
from ._train_eval import TrainingEval, check_eval_env
from ._setup import (
    build_data,
    build_policy,
    new_run_id,
    parallelize,
    prepare_output,
    resolve_features,
    seed_everything,
)


def log(ctx: DistContext, message: str) -> None:
    if ctx.is_main:
        print(message, flush=True)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _next_status(run: Run, status: str, step: int, error: str | None = None) -> RunStatus:
    run.status = replace(run.status, status=status, step=step, updated=_now(), error=error)  # type: ignore[arg-type]
    return run.status


def write_status(run: Run, status: str, step: int, error: str | None = None) -> None:
    if not run.ctx.is_main:
        return
    save_run_status(run.output_dir / RUN_STATUS, _next_status(run, status, step, error))


def build_run(cfg: TrainConfig, ctx: DistContext) -> Run:
    checkpointing.check_publish(cfg)
    resume = checkpointing.read_resume(cfg) if cfg.resume else None
    cfg = prepare_output(cfg, ctx, resume.step_dir if resume else None)
    if resume is not None:
        checkpointing.check_steps_continue(cfg, resume.training_step.step)
    cfg = resolve_features(cfg, ctx, resume.step_dir if resume else None)
    check_eval_env(cfg)
    data = build_data(cfg, ctx, resume.training_step if resume else None, resume.saved_config.dataset if resume else None)
    policy = build_policy(cfg, ctx.device)
    base_record = checkpointing.adapter_base(cfg, ctx, resume)
    seed_everything(cfg.seed + 7919 * ctx.rank)
    if resume is not None:
        checkpointing.restore_rng_or_warn(resume, ctx)
    model, plan = parallelize(policy, cfg, ctx)
    optimizer = make_optimizer(model.parameters(), cfg.optimizer)
    scaler = make_scaler(cfg, ctx.device)
    run = Run(cfg=cfg, ctx=ctx, data=data, policy=policy, model=model, plan=plan, optimizer=optimizer, scaler=scaler,
              run_id=resume.training_step.run_id if resume else new_run_id(), base_record=base_record,
              fault=_faults.from_env(ctx))
    if resume is not None:
        run.resumed_into_own_folder = resume.step_dir.parent.parent.resolve() == run.output_dir.resolve()
        checkpointing.load_state(run, resume)
        run.start_step = resume.training_step.step
        run.start_samples = resume.training_step.samples_seen
        run.updates = resume.training_step.optimizer_updates
        if resume.training_step.last_eval_step is not None and resume.training_step.last_eval is not None:
            run.last_eval = (resume.training_step.last_eval_step, resume.training_step.last_eval)
        checkpointing.warn_changed_settings(run, resume)
    return run


def start_files(run: Run) -> None:
    """Main rank: train_config.json and run.json at start. A resume into the run's own folder
    first cuts its metrics files back to the resumed step (the steps after it are trained again)."""
    if not run.ctx.is_main:
        return
    if run.resumed_into_own_folder:
        for path in [run.output_dir / METRICS, *sorted(run.output_dir.glob("metrics_rank*.jsonl"))]:
            if keep_records_through(path, run.start_step):
                log(run.ctx, f"{path}: records after step {run.start_step} dropped (that step is where training resumes)")
    run.output_dir.mkdir(parents=True, exist_ok=True)
    save_json(run.output_dir / TRAIN_CONFIG, to_dict(run.cfg))
    run.status = RunStatus(
        status="running", pid=os.getpid(), hostname=socket.gethostname(), started=_now(), updated=_now(),
        output_dir=str(run.output_dir.resolve()), job_name=run.cfg.job_name or "", step=run.start_step,
        steps=run.cfg.steps, world_size=run.ctx.world_size,
    )
    save_run_status(run.output_dir / RUN_STATUS, run.status)


def banner(run: Run) -> None:
    cfg, ctx = run.cfg, run.ctx
    total = sum(p.numel() for p in run.policy.parameters())
    trainable = sum(p.numel() for p in run.policy.parameters() if p.requires_grad)
    log(ctx, f"lr-engine: {cfg.policy.type_name} policy, {total:,} parameters ({trainable:,} trainable) on {ctx.device.type}")
    if (note := demo_preset_note(cfg.policy)) is not None:
        log(ctx, f"policy: {note}")
    if (optimizer := lerobot_optimizer_note(cfg)) is not None:
        log(ctx, optimizer)
    log(ctx, banner_line(cfg, ctx.topology))
    if cfg.steps % cfg.grad_accum_steps:
        last_update = cfg.steps - cfg.steps % cfg.grad_accum_steps
        log(ctx, f"warning: --steps={cfg.steps} is not a multiple of the accumulation steps; the last partial accumulation is not applied"
                 + (f", and the final checkpoint is step {last_update}" if cfg.save_checkpoint else ""))
    if cfg.save_checkpoint and cfg.save_freq % cfg.grad_accum_steps:
        log(ctx, f"checkpoints: every {cfg.save_freq} steps, at the update that completes each (one every "
                 f"{cfg.grad_accum_steps} loop steps with --accelerator.gradient_accumulation.steps={cfg.grad_accum_steps}): "
                 f"steps {save_steps_text(cfg)}, ...")
    if cfg.checkpoint_format != "safetensors" and cfg.save_checkpoint and not ctx.topology.sharded:
        log(ctx, f"checkpoints: --checkpoint_format={cfg.checkpoint_format} shards nothing on a run that does not shard "
                 f"({ctx.topology.describe()}): each checkpoint is one model.safetensors, as training_step.json records")
    if run.plan is not None:
        log(ctx, f"FSDP units ({run.plan.source}): {len(run.plan.units)}" + (f"; ignored: {', '.join(run.plan.ignored)}" if run.plan.ignored else ""))
    log(ctx, f"dataset {cfg.dataset.root}: {len(run.data.dataset)} frames; output {run.output_dir}")
    if cfg.eval_freq > 0:
        log(ctx, f"eval: every {cfg.eval_freq} steps and at the end, {cfg.eval.n_episodes} episodes of {cfg.env.type} "
                 f"(seeds {cfg.seed}..{cfg.seed + cfg.eval.n_episodes - 1}) on rank 0; the other ranks wait for it")
    log(ctx, checkpointing.publish_plan(cfg))


def batches(run: Run) -> Iterator[tuple[dict[str, torch.Tensor], float]]:
    """This rank's micro-batches on device, normalized, with the time spent waiting for each."""
    it = iter(run.data.loader)
    non_blocking = run.ctx.device.type == "cuda"
    while True:
        t0 = time.perf_counter()
        try:
            raw = next(it)
        except DatasetError as exc:  # a frame that cannot be decoded: its file and episode, not a worker's traceback
            raise from_worker(exc) from None
        batch = {k: v.to(run.ctx.device, non_blocking=non_blocking) for k, v in raw.items()}
        yield run.data.pre(batch), time.perf_counter() - t0


def grad_sync(run: Run, enabled: bool) -> contextlib.AbstractContextManager[Any]:
    """Skip gradient communication on non-final micro-steps (DDP and FSDP2 alike)."""
    model = run.model
    if isinstance(model, nn.parallel.DistributedDataParallel) and not enabled:
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(enabled)
    return contextlib.nullcontext()


def forward_backward(run: Run, batch: dict[str, torch.Tensor], last_micro: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    sharded = run.ctx.topology.sharded
    with grad_sync(run, last_micro):
        with autocast_for(run.cfg, run.ctx.device, sharded):
            loss, info = run.model(batch)
        scaled = loss / run.cfg.grad_accum_steps
        if run.scaler is not None:
            scaled = run.scaler.scale(scaled)
        scaled.backward()
    # detached: the step's autograd graph is freed here, not kept alive through the next forward
    return loss.detach(), {k: v.detach() for k, v in info.items()}


def update(run: Run, step: int) -> None:
    """Unscale, clip, set this step's LR and apply one optimizer update (all ranks agree on skips)."""
    sync_ignored_grads(run.model, run.plan, run.ctx.world_size)
    # the optimizer's parameters are the trainable ones, in model order (make_optimizer);
    # listing them from its groups skips a walk of the module tree at every update
    params = [p for group in run.optimizer.param_groups for p in group["params"]]
    if run.scaler is not None:
        run.scaler.unscale_(run.optimizer)
    run.grad_norm = clip_and_norm(params, run.cfg.optimizer.grad_clip_norm).detach()
    set_lr(run.optimizer, lr_at(step, run.cfg.steps, run.cfg.optimizer, run.cfg.scheduler))
    if run.scaler is None:
        run.optimizer.step()
    elif bool(torch.isfinite(run.grad_norm)):
        run.scaler.step(run.optimizer)
        run.scaler.update()
    else:
        # The norm is global, so every rank takes this branch together; a per-rank found_inf
        # (what GradScaler.step uses) can disagree when only one shard overflowed.
        run.skipped_updates += 1
        backed_off = run.scaler.get_scale() * run.scaler.get_backoff_factor()
        run.scaler.update(new_scale=backed_off)  # also clears this iteration's unscale_ records
        # as GradScaler does on an overflow, the count of good steps towards the next growth
        # restarts (update(new_scale=) keeps it), through its public state dict
        run.scaler.load_state_dict({**run.scaler.state_dict(), "scale": backed_off, "_growth_tracker": 0})
    run.optimizer.zero_grad(set_to_none=True)
    run.updates += 1


def log_step(run: Run, window: MetricsWindow, sink: MetricsSink | None, step: int, evaluation: EvalAggregate | None = None) -> MetricsWindow:
    reduced = window.reduce(run.ctx.world_size, run.samples_per_step)
    info = dict(reduced["info"])
    if run.scaler is not None:
        info["loss_scale"] = float(run.scaler.get_scale())
        info["skipped_updates"] = float(run.skipped_updates)
    record = MetricsRecord(
        step=step,
        epoch=run.data.sampler.epoch_after(step - run.start_step - 1),
        samples=run.samples_at(step),
        loss=reduced["loss"],
        lr=lr_at(step - 1, run.cfg.steps, run.cfg.optimizer, run.cfg.scheduler),
        grad_norm=float(run.grad_norm),
        update_s=reduced["update_s"],
        dataloading_s=reduced["dataloading_s"],
        samples_per_s=reduced["samples_per_s"],
        mem_gb=reduced["mem_gb"],
        info=info,
        eval=evaluation,
    )
    if reduced["local_loss"] is not None:
        with open(run.output_dir / f"metrics_rank{run.ctx.rank}.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "loss": reduced["local_loss"]}) + "\n")
    if sink is not None:  # the main rank: run.json follows the metrics line, in the sink's background thread
        sink.write(record, then=functools.partial(save_run_status, run.output_dir / RUN_STATUS, _next_status(run, "running", step)))
    return MetricsWindow(device=run.ctx.device, started=window.ended)


def accumulations(start: int, steps: int, k: int) -> Iterator[range]:
    """The loop steps of each optimizer update after loop step `start`: runs of K that end on
    multiples of K (the first is shorter when a resume changed K), then a partial run when
    --steps is not a multiple of K, which is trained but not applied (the banner warns)."""
    first = start + 1
    while first <= steps:
        last = min((first - 1) // k * k + k, steps)
        yield range(first, last + 1)
        first = last + 1


@dataclass
class Metrics:
    """The loop's metrics: the window of steps since the last record, and the main rank's sink."""

    run: Run
    window: MetricsWindow
    sink: MetricsSink | None

    def add(self, step: int, loss: torch.Tensor, info: dict[str, torch.Tensor], data_s: float) -> None:
        self.window.add(loss, info, data_s)
        if self.sink is not None:
            self.sink.advance(step)

    def log_if_due(self, step: int, stopping: bool, evaluation: EvalAggregate | None = None, evaluated: bool = False) -> None:
        """A record at each --log_freq step, the last step, a stop, and a step with an evaluation
        (`evaluated`, on every rank; its result, `evaluation`, is the main rank's)."""
        if step % self.run.cfg.log_freq == 0 or step == self.run.cfg.steps or stopping or evaluated:
            self.window = log_step(self.run, self.window, self.sink, step, evaluation)


def train_step(run: Run, steps: range, stream: Iterator[tuple[dict[str, torch.Tensor], float]],
               checkpointer: Checkpointer, metrics: Metrics, evaluator: TrainingEval | None = None) -> bool:
    """One optimizer update: the forward and backward of each micro-batch in `steps` (loop steps),
    the update after the last one when it ends on a multiple of K, the --eval_freq evaluation due
    after it, and the log records due in between. Returns whether every rank agreed to stop at
    this update."""
    k = run.cfg.grad_accum_steps
    applies = steps[-1] % k == 0
    stopping = False
    for step in steps:
        run.current_step = step - 1
        batch, data_s = next(stream)
        checkpointer.batch_ready()
        last = step == steps[-1]
        loss, info = forward_backward(run, batch, last and applies)
        if last and applies:
            if run.fault is not None:
                run.fault(run.model, step - 1)
            checkpointer.before_update()
            update(run, step - 1)
        run.current_step = step
        metrics.add(step, loss, info, data_s)
        stopping = last and applies and checkpointer.stop_agreed()
        evaluation = None
        evaluated = last and applies and evaluator is not None and evaluator.due(step)
        if evaluated:
            assert evaluator is not None
            started = time.perf_counter()
            evaluation = evaluator(step)
            metrics.window.paused_s += time.perf_counter() - started
        metrics.log_if_due(step, stopping, evaluation, evaluated)
    return stopping


def train_loop(run: Run) -> int:
    """The loop over optimizer updates, from the run's start step to --steps or an agreed stop.
    Returns the last loop step run."""
    cfg = run.cfg
    metrics = Metrics(run, MetricsWindow(device=run.ctx.device),
                      MetricsSink(cfg, run.output_dir, cfg.steps, run.start_step) if run.ctx.is_main else None)
    run.model.train()
    stream = batches(run)
    step = run.start_step
    checkpointer = Checkpointer(run)
    evaluator = TrainingEval(run) if cfg.eval_freq > 0 else None
    failed = True
    try:
        with checkpointer:
            for steps in accumulations(run.start_step, cfg.steps, cfg.grad_accum_steps):
                stopping = train_step(run, steps, stream, checkpointer, metrics, evaluator)
                step = steps[-1]
                if step % cfg.grad_accum_steps == 0:
                    checkpointer.after_update(step, stopping)
                if stopping:
                    break
        failed = False
    finally:
        if metrics.sink is not None:
            metrics.sink.close(failed=failed)  # the metrics and run.json writes in flight are done before anything else is written
    checkpointer.finish()  # not on errors: a failed rank never posts the stop exchange the others wait for
    return step


@dataclass(frozen=True)
class TrainResult:
    """How `train` ended on this rank: the run folder, whether it stopped on request (SIGINT/SIGTERM,
    final checkpoint saved) rather than finishing its --steps, and the last loop step run."""

    output_dir: Path
    stopped: bool
    step: int


def resume_hint(run: Run, step: int) -> str:
    """The line that says how to go on from the run's last checkpoint: the command that resumes a
    stopped run, or that trains a finished one longer (a resume needs --steps above its step)."""
    launcher = "lr-engine train"
    if os.environ.get(LAUNCH_COMMAND_ENV):  # started by `lr-engine launch`, which says how
        launcher = f"{os.environ[LAUNCH_COMMAND_ENV]} train"
    elif run.ctx.distributed:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", run.ctx.world_size))
        nodes = run.ctx.world_size // max(local, 1)
        launcher = f"torchrun --nproc-per-node={local} -m lr_engine.cli train" if nodes == 1 else "<the same launcher on each node> lr-engine train"
    command = f"{launcher} --resume=true --config_path={run.output_dir / CHECKPOINTS / LAST}"
    if run.stopped:
        return f"resume with: {command}"
    return f"train longer with: {command} --steps={2 * run.cfg.steps}   (any --steps above {step})"


def train(cfg: TrainConfig, ctx: DistContext) -> TrainResult:
    """Train on every rank. Raises on failure (the CLI reports it)."""
    run = build_run(cfg, ctx)
    start_files(run)
    banner(run)
    try:
        # the data files' mapped copies, made by one process per node now that every check passed
        # (a refused run writes nothing, not even a cache)
        one_per_node(ctx, run.data.dataset.map_files)
        last = train_loop(run)
        final_state = checkpointing.write_final_model(run)
    except BaseException as exc:
        write_status(run, "failed", run.current_step, error=f"{type(exc).__name__}: {exc}")
        raise
    write_status(run, "stopped" if run.stopped else "finished", last)
    saved = f"checkpoints in {run.output_dir / CHECKPOINTS}" if cfg.save_checkpoint else "no checkpoints (--save_checkpoint=false)"
    log(ctx, f"done: {saved}, metrics in {run.output_dir / METRICS}, model in {run.output_dir / PRETRAINED}")
    if cfg.save_checkpoint:
        log(ctx, resume_hint(run, last))
    if checkpointing.pushes(cfg):  # last: a push that fails leaves the run finished and ends with the retry command
        checkpointing.publish(run, last, final_state)
    return TrainResult(output_dir=run.output_dir, stopped=run.stopped, step=last)
