"""Mixed precision as the locked torch applies it: what lr records is what FSDP2 does."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from lr_config import parse_train_config

from lr_engine._parallel.precision import effective_dtypes, reduce_follows_param_dtype

# FSDP2 on one gloo rank: the dtype its reduce-scatter uses for a parameter (FSDPParam's own answer).
_PROBE = r"""
import json, os, sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
fully_shard(model, mesh=init_device_mesh("cpu", (1,)), mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
model(torch.randn(3, 4)).float().sum().backward()
params = model._get_fsdp_state()._fsdp_param_group.fsdp_params
print(json.dumps(sorted({str(p.unsharded_grad_dtype).removeprefix("torch.") for p in params})))
dist.barrier(); dist.destroy_process_group(); sys.stdout.flush(); os._exit(0)
"""


def test_an_unset_reduce_dtype_reduces_in_the_parameters_own_dtype_on_the_locked_torch(free_port_number: int) -> None:
    done = subprocess.run([sys.executable, "-c", _PROBE, str(free_port_number)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["float32"]  # torch >= 2.15: not param_dtype (bfloat16)
    cfg = parse_train_config(["--accelerator.fsdp.mixed_precision_policy.param_dtype=bfloat16"])
    assert effective_dtypes(cfg, sharded=True) == {"param_dtype": "bfloat16", "reduce_dtype": "float32", "output_dtype": "bfloat16"}
    assert not reduce_follows_param_dtype(torch.__version__) and reduce_follows_param_dtype("2.14.1")


@pytest.mark.parametrize(
    "flags,sharded,expected",
    [
        ([], False, ("float32", "float32", "float32")),
        (["--accelerator.mixed_precision=bf16"], False, ("bfloat16", "float32", "bfloat16")),
        (["--accelerator.mixed_precision=fp16"], True, ("float16", "float32", "float16")),
        (["--accelerator.fsdp.mixed_precision_policy.param_dtype=bfloat16", "--accelerator.fsdp.mixed_precision_policy.reduce_dtype=bfloat16"],
         True, ("bfloat16", "bfloat16", "bfloat16")),
        (["--policy.dtype=bfloat16"], False, ("bfloat16", "bfloat16", "bfloat16")),
        (["--policy.dtype=bfloat16"], True, ("bfloat16", "bfloat16", "bfloat16")),
        (["--policy.dtype=bfloat16", "--accelerator.mixed_precision=bf16"], True, ("bfloat16", "float32", "bfloat16")),
    ],
)
def test_effective_dtypes(flags: list[str], sharded: bool, expected: tuple[str, str, str]) -> None:
    dtypes = effective_dtypes(parse_train_config(flags), sharded)
    assert (dtypes["param_dtype"], dtypes["reduce_dtype"], dtypes["output_dtype"]) == expected


@pytest.fixture
def free_port_number() -> int:
    from _support.procs import free_port

    return free_port()
