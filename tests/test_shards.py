"""FSDP2 shards each parameter 1/N per rank (dim 0), and ignored modules stay whole
(with CPU offload and without resharding after forward, which must not change the shards)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _support.procs import run_ranks

pytestmark = pytest.mark.multiprocess

WORKER = Path(__file__).parent / "workers" / "shard_worker.py"


def test_local_shards_are_one_nth_and_ignored_modules_are_whole(tmp_path: Path, demo_dataset: Path) -> None:
    n = 2
    proc = run_ranks(
        n,
        [str(WORKER), str(tmp_path), f"--output_dir={tmp_path / 'run'}", f"--dataset.root={demo_dataset}",
         "--policy.dim_model=32", "--policy.dim_feedforward=64", "--policy.n_heads=2", "--parallelism.dp_shard=2",
         "--accelerator.fsdp.ignored_modules=.*vae_encoder", "--accelerator.fsdp.cpu_offload=true",
         "--accelerator.fsdp.reshard_after_forward=false"],
        module=None,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(n)]
    assert ranks[0].keys() == ranks[1].keys()
    ignored = [k for k in ranks[0] if k.startswith("model.vae_encoder.")]
    assert ignored
    for name in ranks[0]:
        sizes = [r[name]["local"] for r in ranks]
        total = ranks[0][name]["global"]
        if name in ignored:
            assert not ranks[0][name]["dtensor"] and sizes == [total, total], name
            continue
        assert ranks[0][name]["dtensor"], name
        assert sum(sizes) == total, name
        if ranks[0][name]["rows"] % n == 0:
            assert sizes == [total // n] * n, name



def test_save_pretrained_is_collective_on_a_sharded_policy(tmp_path: Path, demo_dataset: Path) -> None:
    """`lr_engine.save_pretrained(model, folder)` called on every rank of an FSDP2 run (the worker above)
    gathers the shards once and the main rank writes: the folder holds the whole policy, which loads."""
    import torch
    from lr_config import load_policy_config
    from safetensors.torch import load_file

    from lr_engine import load_pretrained, make_policy

    proc = run_ranks(2, [str(WORKER), str(tmp_path), f"--output_dir={tmp_path / 'run'}", f"--dataset.root={demo_dataset}",
                            "--policy.dim_model=32", "--policy.dim_feedforward=64", "--policy.n_heads=2", "--parallelism.dp_shard=2"],
                        module=None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = load_file(str(tmp_path / "saved" / "model.safetensors"))
    torch.manual_seed(1000)  # the engine builds the policy from --seed (default 1000) on every rank
    fresh = make_policy(load_policy_config(tmp_path / "saved")).state_dict()
    assert saved.keys() == fresh.keys()
    assert all(torch.equal(saved[k], fresh[k]) for k in fresh)
    assert load_pretrained(tmp_path / "saved").state_dict().keys() == fresh.keys()
