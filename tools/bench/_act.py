"""ACT runs for the loop benchmarks: the engine's loop and a bare hand-written loop.

Both build the same policy (`lr_engine.make_policy`, same seed and config), read
the same demo dataset through the same normalizer, with the same batch size, the same
AdamW settings (the engine's `make_optimizer` hyper-parameters, fused) and the same
global-norm clipping, on the same layout (single, DDP, or FSDP2 with the policy's
ACTEncoderLayer/ACTDecoderLayer units then the root). The bare loop has no metrics, no
logging, no schedule and no checkpoints. Both are timed in windows of `log_freq` loop
steps; the first window (warm-up) is excluded.

For the CPU overhead benchmark the two run step by step in the same processes
(`run_paired`): one bare step, then one engine step, and so on, so that both see the same
load from moment to moment (on a shared machine, runs even seconds apart can differ by
tens of percent). `run_engine` and `run_bare` run each alone (the GPU benchmark, where
peak memory must belong to one loop). The engine's window times come from its own
`metrics.jsonl` (`(update_s + dataloading_s) x steps`, the max over ranks).
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lr_config.layout import METRICS

# About 10M parameters with the demo dataset's 2-D state/env/action; chunk 10 and 4 heads, the sizes
# these benchmarks have always measured (LeRobot's ACT defaults are chunk 100 and 8 heads).
ACT_FLAGS = [
    "--policy.type=act",
    "--policy.chunk_size=10",
    "--policy.n_action_steps=10",
    "--policy.n_heads=4",
    "--policy.pretrained_backbone_weights=null",
    "--policy.dim_model=256",
    "--policy.dim_feedforward=1024",
    "--policy.n_encoder_layers=4",
    "--policy.n_decoder_layers=4",
    "--policy.n_vae_encoder_layers=4",
]
SMOKE_ACT_FLAGS = [
    "--policy.type=act",
    "--policy.chunk_size=10",
    "--policy.n_action_steps=10",
    "--policy.n_heads=4",
    "--policy.pretrained_backbone_weights=null",
    "--policy.dim_model=32",
    "--policy.dim_feedforward=64",
    "--policy.n_encoder_layers=1",
    "--policy.n_decoder_layers=1",
    "--policy.n_vae_encoder_layers=1",
]
LAYOUT_FLAGS = {"single": [], "ddp": [], "fsdp2": ["--parallelism.dp_shard=-1"]}


def act_flags(smoke: bool) -> list[str]:
    return list(SMOKE_ACT_FLAGS if smoke else ACT_FLAGS)


def train_config(flags: list[str]) -> Any:
    from lr_config import parse_train_config, validate

    cfg = parse_train_config(flags)
    validate(cfg)
    return cfg


_contexts: dict[str, Any] = {}


def context_for(layout: str, cfg: Any) -> Any:
    """The engine's DistContext for `layout`. The first one initializes the process group
    (`init_distributed`, the engine's own path); later layouts of the same launch reuse the
    group and its control group, and get their own mesh, as init_distributed builds it."""
    if layout in _contexts:
        return _contexts[layout]
    import torch.distributed as dist
    from lr_config import validate
    from lr_engine import DistContext, best_device, init_distributed, launcher_world
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        ctx = init_distributed(cfg)
    else:
        world, rank, local_rank, nnodes = launcher_world()
        topo = validate(cfg, world_size=world, nnodes=nnodes)
        device = best_device(cfg.policy.device, local_rank)
        mesh = init_device_mesh(device.type, (topo.dp_replicate, topo.dp_shard), mesh_dim_names=("dp_replicate", "dp_shard"))
        # the first context's control group (stop requests) serves every layout, as in the engine
        control = next(iter(_contexts.values())).control_group if _contexts else dist.group.WORLD
        ctx = DistContext(rank=rank, local_rank=local_rank, world_size=world, topology=topo, device=device, mesh=mesh,
                          control_group=control)
    if ctx.topology.layout != layout:
        raise RuntimeError(f"asked for layout {layout}, the flags give {ctx.topology.layout}")
    _contexts[layout] = ctx
    return ctx


def steady_rate(windows: list[tuple[int, float]]) -> tuple[float, int]:
    """(loop steps per second, steps counted) over the windows after the first."""
    steady = windows[1:]
    steps = sum(n for n, _ in steady)
    wall = sum(t for _, t in steady)
    return steps / wall, steps


# ---------------------------------------------------------------- the engine


@dataclass
class EngineResult:
    windows: list[tuple[int, float]]
    mem_gb: float


def engine_windows(metrics_path: Path) -> EngineResult:
    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    windows: list[tuple[int, float]] = []
    previous = 0
    for rec in records:
        steps = rec["step"] - previous
        previous = rec["step"]
        windows.append((steps, (rec["update_s"] + rec["dataloading_s"]) * steps))
    return EngineResult(windows=windows, mem_gb=max(r["mem_gb"] for r in records))


def run_engine(flags: list[str], layout: str, output_dir: Path) -> EngineResult | None:
    """One engine run on every rank; the main rank returns its windows, others None."""
    from lr_engine import barrier, train

    cfg = train_config([*flags, *LAYOUT_FLAGS[layout], f"--output_dir={output_dir}"])
    ctx = context_for(layout, cfg)
    if ctx.device.type == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats(ctx.device)
    train(cfg, ctx)
    barrier()
    return engine_windows(output_dir / METRICS) if ctx.is_main else None


# ---------------------------------------------------------------- the bare loop


def _bare_model(cfg: Any, ctx: Any, policy: Any) -> Any:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    layout = ctx.topology.layout
    units = set(type(policy)._fsdp_wrap_modules)  # the FSDP units the policy declares, as the engine wraps them
    if layout == "ddp":
        return torch.nn.parallel.DistributedDataParallel(policy, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    if layout == "fsdp2":
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if cfg.accelerator.mixed_precision == "bf16" else MixedPrecisionPolicy()
        for module in policy.modules():
            if type(module).__name__ in units:
                fully_shard(module, mesh=mesh, mp_policy=mp)
        fully_shard(policy, mesh=mesh, mp_policy=mp)
    return policy


def _bare_loader(cfg: Any, ctx: Any) -> tuple[Any, Any]:
    import torch
    from lr_engine import LeRobotDataset, load_meta, make_processors, resolve_dataset_root

    root = resolve_dataset_root(cfg.dataset, create_demo=False)
    dataset = LeRobotDataset(root, action_horizon=cfg.policy.chunk_size)
    if ctx.world_size > 1:
        sampler: Any = torch.utils.data.DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=cfg.seed, drop_last=True)
    else:
        sampler = torch.utils.data.RandomSampler(dataset, generator=torch.Generator().manual_seed(cfg.seed))
    loader = torch.utils.data.DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler, drop_last=True, num_workers=cfg.num_workers,
                                         persistent_workers=cfg.num_workers > 0, pin_memory=ctx.device.type == "cuda")
    meta = load_meta(root)
    pre, _ = make_processors(cfg.policy.input_features, cfg.policy.output_features, dict(cfg.policy.normalization_mapping), meta.stats)
    return loader, pre


def _batches(loader: Any, device: Any) -> Any:
    epoch = 0
    while True:
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        for batch in loader:
            yield {k: v.to(device, non_blocking=device.type == "cuda") for k, v in batch.items()}
        epoch += 1


def _clip(params: list[Any], max_norm: float) -> None:
    import torch
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads, 2.0)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)


class BareLoop:
    """The hand-written loop, built on every rank; `step()` runs one loop step."""

    def __init__(self, flags: list[str], layout: str) -> None:
        import torch
        from lr_engine import load_meta, make_policy, resolve_dataset_root

        cfg = train_config([*flags, *LAYOUT_FLAGS[layout]])
        self.ctx = ctx = context_for(layout, cfg)
        meta = load_meta(resolve_dataset_root(cfg.dataset, create_demo=ctx.is_main))
        inputs, outputs = meta.policy_features()
        self.cfg = cfg = replace(cfg, policy=replace(cfg.policy, input_features=inputs, output_features=outputs))
        torch.manual_seed(cfg.seed)
        policy = make_policy(cfg.policy).to(ctx.device)
        self.parameters = sum(p.numel() for p in policy.parameters())
        self.model = _bare_model(cfg, ctx, policy)
        opt = cfg.optimizer
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=opt.lr, betas=tuple(opt.betas), eps=opt.eps, weight_decay=opt.weight_decay, fused=True)
        loader, self.pre = _bare_loader(cfg, ctx)
        self.batches = _batches(loader, ctx.device)
        bf16 = cfg.accelerator.mixed_precision == "bf16" and layout != "fsdp2"
        self.autocast = (lambda: torch.autocast(ctx.device.type, dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
        self.model.train()

    def step(self) -> None:
        batch = self.pre(next(self.batches))
        with self.autocast():
            loss, _ = self.model(batch)
        loss.backward()
        if self.cfg.optimizer.grad_clip_norm > 0:
            _clip(self.params, self.cfg.optimizer.grad_clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


@dataclass
class BareResult:
    windows: list[tuple[int, float]]
    mem_gb: float
    parameters: int


def run_bare(flags: list[str], layout: str) -> BareResult | None:
    """The bare loop alone, timed in windows; the main rank returns them, others None."""
    import torch
    from lr_engine import barrier

    bare = BareLoop(flags, layout)
    ctx, cfg = bare.ctx, bare.cfg
    cuda = ctx.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(ctx.device)
    windows: list[tuple[int, float]] = []
    last_step = 0
    start = time.perf_counter()
    for step in range(1, cfg.steps + 1):
        bare.step()
        if step % cfg.log_freq == 0 or step == cfg.steps:
            if cuda:
                torch.cuda.synchronize(ctx.device)
            stop = time.perf_counter()
            windows.append((step - last_step, stop - start))
            last_step, start = step, stop
    mem = torch.cuda.max_memory_allocated(ctx.device) / 1e9 if cuda else float("nan")
    barrier()
    return BareResult(windows=windows, mem_gb=mem, parameters=bare.parameters) if ctx.is_main else None


# ---------------------------------------------------------------- both, step by step


class _Interleaved:
    """The engine's DataLoader, with one bare-loop step run (and timed) before each batch."""

    def __init__(self, loader: Any, bare: BareLoop) -> None:
        self.loader = loader
        self.bare = bare
        self.times: list[float] = []

    def __iter__(self) -> Any:
        for batch in self.loader:
            t0 = time.perf_counter()
            self.bare.step()
            self.times.append(time.perf_counter() - t0)
            yield batch


@dataclass
class PairedResult:
    """Per steady window: (steps, engine seconds, bare seconds)."""

    windows: list[tuple[int, float, float]]
    parameters: int


def run_paired(flags: list[str], layout: str, output_dir: Path) -> PairedResult | None:
    """The engine's loop and the bare loop, alternating step by step on every rank.

    The engine runs its own steps (`build_run`, `start_files`, `train_loop`: what `train` runs,
    without the banner and the final model); its DataLoader is wrapped so that, before
    each batch it hands over, the bare loop takes one step. The engine's `metrics.jsonl`
    gives each window's time; the bare steps inside it, timed apart, are subtracted from it
    and are the bare loop's time for the same window. The main rank returns the windows
    after the first, others None.
    """
    from lr_engine import barrier, build_run, start_files, train_loop

    bare = BareLoop(flags, layout)
    cfg = train_config([*flags, *LAYOUT_FLAGS[layout], f"--output_dir={output_dir}"])
    run = build_run(cfg, context_for(layout, cfg))
    paired = _Interleaved(run.data.loader, bare)
    run.data.loader = paired  # type: ignore[assignment]
    start_files(run)
    train_loop(run)
    barrier()
    if not run.ctx.is_main:
        return None
    engine = engine_windows(output_dir / METRICS).windows
    rows, first = [], 0
    for steps, wall in engine:
        bare_s = sum(paired.times[first : first + steps])
        rows.append((steps, wall - bare_s, bare_s))
        first += steps
    return PairedResult(windows=rows[1:], parameters=bare.parameters)
