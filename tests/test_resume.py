"""Resume through the real CLI: bit-exact on the same topology, resharded on another.

Each straight run trains 8 steps and saves at 4 and 8. A resumed run starts from the
step-4 checkpoint, writes into a fresh folder (`--output_dir` overrides the file) and
must reproduce steps 5-8: identical losses and `torch.equal` weights and optimizer state
on the same topology; losses within 1e-5 on another topology with the same global batch.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from _support.metrics import grad_norms, losses, records
from _support.procs import run_cli, run_ranks
from _support.runs import TINY as TINY_RUN_FLAGS
from _support.runs import TinyRun, copy_run, tree_digest

pytestmark = pytest.mark.multiprocess

TINY = [
    "--policy.dim_model=32",
    "--policy.dim_feedforward=64",
    "--policy.n_heads=2",
    "--policy.chunk_size=5",
    "--policy.n_action_steps=5",
    "--scheduler.type=constant",
    "--scheduler.warmup_steps=0",
    "--log_freq=1",
    "--save_freq=4",
]
DETERMINISTIC = ["--policy.use_vae=false", "--policy.dropout=0"]
# Both degrees are always given: a resumed config carries the saved run's resolved degrees,
# and a new topology must be asked for explicitly.
LAYOUTS = {
    "single": (1, ["--batch_size=8", "--parallelism.dp_replicate=1", "--parallelism.dp_shard=1"]),
    "ddp": (2, ["--batch_size=4", "--parallelism.dp_replicate=2", "--parallelism.dp_shard=1"]),
    "fsdp": (2, ["--batch_size=4", "--parallelism.dp_replicate=1", "--parallelism.dp_shard=2"]),
    "hsdp": (4, ["--batch_size=2", "--parallelism.dp_replicate=2", "--parallelism.dp_shard=2"]),
}


def launch(nproc: int, argv: list[str]) -> str:
    proc = run_cli(["lr_engine.cli", *argv]) if nproc == 1 else run_ranks(nproc, argv)
    assert proc.returncode == 0, f"{argv}\n{proc.stdout[-2500:]}\n{proc.stderr[-2500:]}"
    return proc.stdout


PRINTED: dict[Path, str] = {}
"""What each straight or resumed run printed (stdout), by output folder."""


def straight(root: Path, dataset: Path, name: str, layout: str, *extra: str) -> Path:
    nproc, flags = LAYOUTS[layout]
    out = root / name
    PRINTED[out] = launch(nproc, ["train", f"--output_dir={out}", f"--dataset.root={dataset}", *TINY, "--steps=8", *flags, *extra])
    return out


def resume(root: Path, source: Path, name: str, layout: str, *extra: str) -> Path:
    nproc, flags = LAYOUTS[layout]
    out = root / name
    config = source / "checkpoints" / "000004" / "pretrained_model" / "train_config.json"
    PRINTED[out] = launch(nproc, ["train", "--resume=true", f"--config_path={config}", f"--output_dir={out}", *flags, *extra])
    return out


def _dcp_tensors(folder: Path) -> dict[str, torch.Tensor]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in meta.items() if isinstance(m, TensorStorageMetadata)}
    dcp.load(state, storage_reader=FileSystemReader(str(folder)), no_dist=True)
    return state


def final_state(run: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(model, optimizer) tensors of the step-8 checkpoint, from whichever files it has."""
    step = run / "checkpoints" / "000008"
    model_file = step / "pretrained_model" / "model.safetensors"
    model = load_file(str(model_file)) if model_file.exists() else _dcp_tensors(step / "pretrained_model" / "pytorch_model_fsdp_0")
    optim_file = step / "training_state" / "optimizer_state.safetensors"
    optim = load_file(str(optim_file)) if optim_file.exists() else _dcp_tensors(step / "training_state" / "optimizer_0")
    return model, optim


def assert_bit_exact(a: Path, b: Path) -> None:
    assert len(losses(a)) == 8 and len(losses(b)) == 4, (losses(a), losses(b))
    assert losses(a)[4:] == losses(b), (losses(a), losses(b))
    assert grad_norms(a)[4:] == grad_norms(b), (grad_norms(a), grad_norms(b))
    (ma, oa), (mb, ob) = final_state(a), final_state(b)
    assert ma.keys() == mb.keys() and oa.keys() == ob.keys() and oa
    for key in ma:
        assert torch.equal(ma[key], mb[key]), key
    for key in oa:
        assert torch.equal(oa[key], ob[key]), key


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("resume")


@pytest.mark.parametrize(
    "layout,extra",
    [
        ("single", []),  # dropout and CVAE sampling on: the RNG state must be restored
        ("ddp", []),  # per-rank RNG
        ("hsdp", DETERMINISTIC),
        # background saves: the loop's next update waits only for the copy of the state. Synchronous
        # dcp is `test_a_sharded_dcp_resume_is_bit_exact`; each format's FSDP2 -> FSDP2 load is
        # bit-exact in lr-checkpoint's own tests (packages/lr-checkpoint/tests/ckpt_worker.py)
        ("fsdp", DETERMINISTIC + ["--checkpoint_format=dcp", "--checkpoint_async=true"]),
    ],
    ids=["single", "ddp", "hsdp", "fsdp-dcp-async"],
)
def test_resume_is_bit_exact_on_the_same_topology(root: Path, demo_dataset: Path, layout: str, extra: list[str]) -> None:
    name = f"{layout}-{len(extra)}-{extra[-1].split('=')[-1] if extra else 'rng'}"
    base = straight(root, demo_dataset, name, layout, *extra)
    again = resume(root, base, name + "-resumed", layout)
    assert_bit_exact(base, again)
    saves = [line.split(": ", 1)[0] + " " + line.rsplit("/", 1)[-1] for line in PRINTED[base].splitlines() if line.startswith("checkpoint ")]
    if "--checkpoint_async=true" in extra:  # "saved" only once committed
        assert saves == ["checkpoint saving in the background 000004", "checkpoint saved 000004",
                         "checkpoint saving in the background 000008", "checkpoint saved 000008"], saves
    else:
        assert saves == ["checkpoint saved 000004", "checkpoint saved 000008"], saves


@pytest.fixture(scope="module")
def sources(root: Path, demo_dataset: Path) -> dict[str, Path]:
    return {
        "fsdp-dcp": straight(root, demo_dataset, "src-fsdp-dcp", "fsdp", *DETERMINISTIC, "--checkpoint_format=dcp"),
        "ddp": straight(root, demo_dataset, "src-ddp", "ddp", *DETERMINISTIC),
        "single": straight(root, demo_dataset, "src-single", "single", *DETERMINISTIC),
    }


def test_a_sharded_dcp_resume_is_bit_exact(sources: dict[str, Path], root: Path) -> None:
    assert_bit_exact(sources["fsdp-dcp"], resume(root, sources["fsdp-dcp"], "fsdp-dcp-again", "fsdp"))


def test_resume_onto_another_topology_needs_explicit_degrees(sources: dict[str, Path]) -> None:
    config = sources["fsdp-dcp"] / "checkpoints" / "000004" / "pretrained_model" / "train_config.json"
    proc = run_cli(["lr_engine.cli", "train", "--resume=true", f"--config_path={config}", "--checkpoint_format=safetensors"])
    assert proc.returncode == 2
    assert "1 x 2 = 2, but 1 process will run" in proc.stderr and "pass both --parallelism.dp_replicate" in proc.stderr


@pytest.mark.parametrize(
    "source,target",
    [("fsdp-dcp", "single"), ("fsdp-dcp", "hsdp"), ("ddp", "fsdp"), ("single", "fsdp")],
)
def test_resume_onto_another_topology_continues_the_loss(sources: dict[str, Path], root: Path, source: str, target: str) -> None:
    base = sources[source]
    fmt = ["--checkpoint_format=safetensors"] if LAYOUTS[target][0] == 1 or target == "ddp" else []
    moved = resume(root, base, f"{source}-to-{target}", target, *fmt)
    assert len(losses(moved)) == 4
    assert losses(moved) == pytest.approx(losses(base)[4:], rel=1e-5)
    assert grad_norms(moved) == pytest.approx(grad_norms(base)[4:], rel=1e-5)
    (ma, _), (mb, _) = final_state(base), final_state(moved)
    # the layouts reduce gradients in another order; where an element's gradient is near zero, Adam
    # turns that rounding into a visible part of an update (at most --optimizer.lr, 1e-3, per step)
    for key in ma:
        torch.testing.assert_close(mb[key], ma[key], rtol=1e-4, atol=1e-4)
    # more processes than saved the checkpoint: the new ranks' RNG starts fresh, and the main rank says so once
    saved, now = LAYOUTS[source if source != "fsdp-dcp" else "fsdp"][0], LAYOUTS[target][0]
    warnings = [line for line in PRINTED[moved].splitlines() if "RNG state" in line]
    if now > saved:
        fresh = f"rank {saved} keeps" if now == saved + 1 else f"ranks {saved}-{now - 1} keep"
        assert len(warnings) == 1 and f"holds RNG state for {saved} process" in warnings[0], warnings
        assert f"not {now}: {fresh} a fresh seed" in warnings[0], warnings
    else:
        assert warnings == []


def test_changed_optimizer_settings_and_seed_apply_on_resume_and_are_listed(sources: dict[str, Path], root: Path) -> None:
    """The loaded optimizer state brings back the saved groups' hyper-parameters; the command's
    flags must win (as train_config.json will say), and the warning lists them and the seed."""
    nproc, flags = LAYOUTS["single"]
    out = root / "changed-optimizer"
    config = sources["single"] / "checkpoints" / "000004" / "pretrained_model" / "train_config.json"
    printed = launch(nproc, ["train", "--resume=true", f"--config_path={config}", f"--output_dir={out}", *flags,
                             "--optimizer.weight_decay=0.5", "--optimizer.eps=1e-06", "--seed=7"])
    warning = next(line for line in printed.splitlines() if line.startswith("warning: resuming"))
    assert "seed 1000 -> 7" in warning and "optimizer.weight_decay 0.0001 -> 0.5" in warning and "optimizer.eps 1e-08 -> 1e-06" in warning
    assert "not sample-exact (the data order follows --seed)" in warning
    groups = json.loads((out / "checkpoints" / "000008" / "training_state" / "optimizer_param_groups.json").read_text())
    assert groups and all(g["weight_decay"] == 0.5 and g["eps"] == 1e-06 for g in groups["param_groups"]), groups
    saved = json.loads((out / "checkpoints" / "000008" / "pretrained_model" / "train_config.json").read_text())
    assert saved["optimizer"]["weight_decay"] == 0.5 and saved["seed"] == 7


def test_a_resume_on_other_episodes_is_listed_and_never_called_exact(sources: dict[str, Path], root: Path) -> None:
    """Another dataset (here a subset of its episodes) has another sample order: the resume goes on,
    and its warning says so instead of 'exact'."""
    nproc, flags = LAYOUTS["single"]
    out = root / "other-episodes"
    config = sources["single"] / "checkpoints" / "000004" / "pretrained_model" / "train_config.json"
    printed = launch(nproc, ["train", "--resume=true", f"--config_path={config}", f"--output_dir={out}", *flags, "--dataset.episodes=[0, 1]"])
    warning = next(line for line in printed.splitlines() if line.startswith("warning: resuming"))
    assert "dataset.episodes None -> [0, 1]" in warning and "not sample-exact (another dataset, or its folder moved)" in warning, warning
    assert json.loads((out / "checkpoints" / "000008" / "training_state" / "training_step.json").read_text())["step"] == 8


def test_a_changed_optimizer_type_is_refused_before_anything_is_written(sources: dict[str, Path], root: Path) -> None:
    out = root / "changed-type"
    config = sources["single"] / "checkpoints" / "000004" / "pretrained_model" / "train_config.json"
    proc = run_cli(["lr_engine.cli", "train", "--resume=true", f"--config_path={config}", f"--output_dir={out}", "--optimizer.type=sgd"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--optimizer.type:" in proc.stderr and "resume with --optimizer.type=adamw" in proc.stderr
    assert not out.exists()


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def test_a_resume_never_writes_into_another_run_nor_over_later_checkpoints(sources: dict[str, Path]) -> None:
    """Into another run's folder: refused (the runs would mix). Into its own folder from an older
    step: refused while later checkpoints exist (they would be replaced). Nothing is written."""
    own, other = sources["single"], sources["ddp"]
    before = {run: _tree(run) for run in (own, other)}
    last = {run: os.readlink(run / "checkpoints" / "last") for run in (own, other)}
    _, flags = LAYOUTS["single"]
    step4 = own / "checkpoints" / "000004"
    into_other = run_cli(["lr_engine.cli", "train", "--resume=true", f"--config_path={own / 'checkpoints' / 'last'}",
                          f"--output_dir={other}", "--steps=12", *flags])  # more steps: the folder is the one problem
    assert into_other.returncode == 2 and "Traceback" not in into_other.stderr
    assert f"--output_dir: {other} already holds another run" in into_other.stderr
    older = run_cli(["lr_engine.cli", "train", "--resume=true", f"--config_path={step4}", *flags])
    assert older.returncode == 2 and "Traceback" not in older.stderr
    assert "--config_path: resuming 000004 of" in older.stderr and "later checkpoints (000008)" in older.stderr
    for run in (own, other):
        assert _tree(run) == before[run] and os.readlink(run / "checkpoints" / "last") == last[run]


def _position(run: Path, step: int) -> tuple[int, int, int]:
    data = json.loads((run / "checkpoints" / f"{step:06d}" / "training_state" / "training_step.json").read_text())
    return data["epoch"], data["epoch_offset"], data["samples_seen"]


def _advance(position: tuple[int, int, int], steps: int, batch: int, frames: int) -> tuple[int, int, int]:
    """The sampler's arithmetic: `steps` global batches of `batch` from (epoch, offset), rounded up to a batch."""
    epoch, offset, seen = position
    per_epoch = frames // batch
    epochs, step = divmod(-(-offset // batch) + steps, per_epoch)
    return epoch + epochs, step * batch, seen + steps * batch


def test_a_resume_continues_where_the_checkpoint_stopped_after_an_earlier_resume_changed_the_batch(root: Path, demo_dataset: Path) -> None:
    """A (batch 64) -> B resumed with batch 32 -> C resumed from B unchanged: C must start where B
    stopped. Its position once came from C's step count alone, as if batch 32 had been used since
    step 0, and C replayed or skipped data with no warning; samples_seen was step x batch."""
    # a constant schedule: a longer --steps then changes nothing else (a decaying one is warned about)
    common = [f"--dataset.root={demo_dataset}", "--policy.type=mlp", "--log_freq=10", "--scheduler.type=constant"]
    a, b, c = root / "pos-a", root / "pos-b", root / "pos-c"
    printed = launch(1, ["train", f"--output_dir={a}", *common, "--batch_size=64", "--steps=20", "--save_freq=20"])
    frames = int(next(line for line in printed.splitlines() if line.startswith("dataset ")).split(": ")[1].split()[0])
    launch(1, ["train", "--resume=true", f"--config_path={a / 'checkpoints' / 'last'}", f"--output_dir={b}", "--batch_size=32",
               "--steps=40", "--save_freq=20"])
    printed_c = launch(1, ["train", "--resume=true", f"--config_path={b / 'checkpoints' / 'last'}", f"--output_dir={c}", "--steps=50",
                           "--save_freq=10"])
    assert not any(line.startswith("warning: resuming") for line in printed_c.splitlines())  # nothing changed: exact
    assert _position(a, 20)[2] == 20 * 64
    assert _position(b, 40) == _advance(_position(a, 20), 20, 32, frames)
    assert _position(c, 50) == _advance(_position(b, 40), 10, 32, frames)
    records = [json.loads(line) for line in (c / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["samples"] == _position(c, 50)[2]


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--steps=4"], "--steps: the checkpoint is at step 4; pass --steps > 4 to continue"),
        (["--steps=3"], "--steps: the checkpoint is at step 4; pass --steps > 4 to continue"),
        # K=3 would make the first update after step 4 take steps 5-6 only (the loop counts K from step 0)
        (["--steps=12", "--accelerator.gradient_accumulation.steps=3", "--save_freq=6"],
         "--accelerator.gradient_accumulation.steps: the checkpoint is at step 4, which is not a multiple of 3, so the first "
         "update would apply a partial accumulation; use a value that divides 4: 1, 2 or 4"),
    ],
    ids=["steps-at-checkpoint", "steps-below-checkpoint", "accumulation-splits-update"],
)
def test_a_resume_that_cannot_continue_is_refused_before_anything_is_written(tiny_run: TinyRun, tmp_path: Path, flags: list[str],
                                                                             message: str) -> None:
    """Once exit 0 with nothing trained: run.json said finished at step 4 of --steps, train_config.json
    said steps=3, and "done" named checkpoints that were never written; or a silent partial update."""
    own = copy_run(tiny_run, tmp_path / "run")
    before = tree_digest(own)
    proc = run_cli(["lr_engine.cli", "train", "--resume=true", f"--config_path={own / 'checkpoints' / 'last'}", *flags])
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert tree_digest(own) == before


def test_a_full_fine_tune_resumes_after_its_base_is_gone(tiny_run: TinyRun, tmp_path: Path, demo_dataset: Path) -> None:
    """Its checkpoints hold every weight and its policy config: the base at --policy.path is not read
    on resume (it once was: exit 2 for a missing config.json, or its weights loaded for nothing)."""
    base = shutil.copytree(tiny_run.path / "pretrained_model", tmp_path / "base")
    tuned = tmp_path / "tuned"
    launch(1, ["train", f"--output_dir={tuned}", f"--dataset.root={demo_dataset}", f"--policy.path={base}",
               *TINY_RUN_FLAGS, "--steps=4", "--save_freq=2"])
    shutil.rmtree(base)
    again = tmp_path / "again"
    launch(1, ["train", "--resume=true", f"--config_path={tuned / 'checkpoints' / '000002'}", f"--output_dir={again}"])
    assert losses(again) == losses(tuned)[2:]  # the checkpoint's weights, RNG and data position: bit-exact


def test_a_resume_with_more_steps_says_how_the_lr_schedule_changes_and_decay_steps_keeps_it(root: Path, demo_dataset: Path) -> None:
    """A cosine schedule decays over --steps: resuming step 4 of an 8-step run with --steps=12 once
    changed the lr silently (the changed settings listed no --steps). The warning names it with the
    lr at the resumed step before and after; --scheduler.decay_steps=8 keeps the checkpoint's
    schedule and trains on at its final lr."""
    common = [f"--dataset.root={demo_dataset}", "--policy.type=mlp", "--log_freq=1", "--save_freq=4", "--scheduler.type=cosine",
              "--scheduler.warmup_steps=0", "--optimizer.lr=0.001", "--scheduler.min_lr_ratio=0.1"]
    source = root / "cosine"
    launch(1, ["train", f"--output_dir={source}", *common, "--steps=8"])
    planned = [r["lr"] for r in records(source)]
    step4 = source / "checkpoints" / "000004"

    longer = root / "cosine-longer"
    printed = launch(1, ["train", "--resume=true", f"--config_path={step4}", f"--output_dir={longer}", "--steps=12"])
    changed = next(line for line in printed.splitlines() if line.startswith("warning: resuming"))
    assert "steps 8 -> 12" in changed, changed
    before, after = 0.0001 + 0.0009 * 0.5 * (1 + math.cos(math.pi * 4 / 8)), 0.0001 + 0.0009 * 0.5 * (1 + math.cos(math.pi * 4 / 12))
    assert f"warning: --steps 8 -> 12 changes the learning-rate schedule (its cosine decay ends at --steps): the lr at step 4 was " \
           f"{before:.2e} and is now {after:.2e}. To keep the checkpoint's schedule and train on at its final lr (1.00e-04) after " \
           "step 8, add --scheduler.decay_steps=8" in printed.splitlines()
    assert [r["step"] for r in records(longer)] == [5, 6, 7, 8, 9, 10, 11, 12]
    assert records(longer)[0]["lr"] == pytest.approx(after) and after != pytest.approx(planned[4])

    kept = root / "cosine-kept"
    printed = launch(1, ["train", "--resume=true", f"--config_path={step4}", f"--output_dir={kept}", "--steps=12",
                         "--scheduler.decay_steps=8"])
    assert not any(line.startswith("warning: --steps") for line in printed.splitlines())
    lrs = [r["lr"] for r in records(kept)]
    assert lrs[:4] == pytest.approx(planned[4:]) and lrs[4:] == pytest.approx([0.0001] * 4)


def test_a_resume_on_video_with_image_transforms_is_bit_exact(root: Path, video_dataset: Path) -> None:
    """Frames decoded in DataLoader workers and augmented per sample: the resumed run sees the same
    frames with the same augmentation (seeded by the sample's place in the global order)."""
    extra = [f"--dataset.root={video_dataset}", "--num_workers=1", "--dataset.image_transforms.enable=true", *DETERMINISTIC]
    nproc, flags = LAYOUTS["single"]
    base = root / "video-transforms"
    PRINTED[base] = launch(nproc, ["train", f"--output_dir={base}", *TINY, "--steps=8", *flags, *extra])
    again = resume(root, base, "video-transforms-resumed", "single")
    assert_bit_exact(base, again)


def test_a_dp_shard_minus_one_run_resumes_onto_one_process_without_flags(root: Path, demo_dataset: Path) -> None:
    """train_config.json keeps the degrees as asked (dp_shard=-1, dp_replicate unset), so the guide's
    resume command reshards a 2-process DCP checkpoint onto one process with no flag: no degrees, no
    --checkpoint_format (the checkpoint is read as it was saved; the next saves are one model.safetensors,
    as the banner says and training_step.json records), and the warning lists what changed."""
    source = root / "minus-one"
    launch(2, ["train", f"--output_dir={source}", f"--dataset.root={demo_dataset}", *TINY, *DETERMINISTIC, "--steps=8",
               "--batch_size=4", "--parallelism.dp_shard=-1", "--checkpoint_format=dcp"])
    saved = json.loads((source / "checkpoints" / "000004" / "pretrained_model" / "train_config.json").read_text())
    assert saved["parallelism"]["dp_shard"] == -1 and saved["parallelism"]["dp_replicate"] is None
    step = json.loads((source / "checkpoints" / "000004" / "training_state" / "training_step.json").read_text())
    assert step["topology"]["dp_shard"] == 2 and step["checkpoint_format"] == "dcp"

    one = root / "minus-one-on-one"
    printed = launch(1, ["train", "--resume=true", f"--config_path={source / 'checkpoints' / '000004'}", f"--output_dir={one}",
                         "--batch_size=8"])
    warning = next(line for line in printed.splitlines() if line.startswith("warning: resuming"))
    assert "world_size 2 -> 1" in warning and "layout fsdp2 -> single" in warning, warning
    assert "checkpoints: --checkpoint_format=dcp shards nothing on a run that does not shard (single process" in printed
    assert losses(one) == pytest.approx(losses(source)[4:], rel=1e-5)  # the same global batch of 8
    written = json.loads((one / "checkpoints" / "000008" / "training_state" / "training_step.json").read_text())
    assert written["checkpoint_format"] == "safetensors" and written["topology"]["world_size"] == 1
    assert (one / "checkpoints" / "000008" / "pretrained_model" / "model.safetensors").exists()


def test_accumulation_with_any_save_freq_saves_at_the_update_that_completes_it(root: Path, demo_dataset: Path) -> None:
    """The guide's --accelerator.gradient_accumulation.steps=K with a --save_freq that is not a multiple of
    K (it was refused): each checkpoint is taken at the update completing a --save_freq boundary, named
    after its step, the banner says which, and a resume from one is exact."""
    common = [f"--dataset.root={demo_dataset}", *TINY, *DETERMINISTIC, "--batch_size=4", "--accelerator.gradient_accumulation.steps=3"]
    base = root / "accum-save"
    printed = launch(1, ["train", f"--output_dir={base}", *common, "--steps=12"])  # TINY saves every 4 steps
    assert sorted(p.name for p in (base / "checkpoints").iterdir() if p.name != "last") == ["000006", "000009", "000012"]
    assert "checkpoints: every 4 steps, at the update that completes each (one every 3 loop steps with " \
           "--accelerator.gradient_accumulation.steps=3): steps 6, 9, 12, ..." in printed
    again = root / "accum-save-resumed"
    launch(1, ["train", "--resume=true", f"--config_path={base / 'checkpoints' / '000006'}", f"--output_dir={again}"])
    assert losses(again) == losses(base)[6:]
    # the norm of each update (a step between updates logs the last update's, which a resume starts without)
    updates = [r["grad_norm"] for r in records(again) if r["step"] % 3 == 0]
    assert updates == [r["grad_norm"] for r in records(base)[6:] if r["step"] % 3 == 0]


def test_every_problem_of_a_resume_is_reported_at_once(tiny_run: TinyRun, tmp_path: Path) -> None:
    """A topology that does not fit, an accumulation that splits the checkpoint's update and too few
    --steps: one refusal lists all three (they once came one per try)."""
    own = copy_run(tiny_run, tmp_path / "run")
    before = tree_digest(own)
    proc = run_cli(["lr_engine.cli", "train", "--resume=true", f"--config_path={own / 'checkpoints' / 'last'}", "--steps=3",
                    "--accelerator.gradient_accumulation.steps=3", "--parallelism.dp_shard=2"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "3 problems in the settings:" in proc.stderr
    for needle in ("1 x 2 = 2, but 1 process will run", "--accelerator.gradient_accumulation.steps: the checkpoint is at step 4",
                   "--steps: the checkpoint is at step 4; pass --steps > 4 to continue"):
        assert needle in proc.stderr, proc.stderr
    assert tree_digest(own) == before
