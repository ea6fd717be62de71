"""Multi-node on loopback: two torchrun "nodes" of 2 processes meet over c10d on 127.0.0.1.

They train HSDP 2x2 (replicate across nodes, shard within a node) and must match a
single-node 4-process HSDP run step for step; a single-node FSDP2 run resumes from their
DCP checkpoint; and a node that dies makes the other exit non-zero instead of hanging.
Also: the Slurm script from lr-config launches what it says, through a stub `srun`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from _support.metrics import grad_norms, losses
from _support.procs import free_port, run_ranks, run_torchrun, subprocess_env

pytestmark = pytest.mark.multiprocess

TINY = [
    "--policy.dim_model=32",
    "--policy.dim_feedforward=64",
    "--policy.n_heads=2",
    "--policy.chunk_size=5",
    "--policy.n_action_steps=5",
    "--policy.use_vae=false",
    "--policy.dropout=0",
    "--scheduler.type=constant",
    "--scheduler.warmup_steps=0",
    "--log_freq=1",
    "--batch_size=2",
]
HSDP = ["--parallelism.dp_replicate=2", "--parallelism.dp_shard=2"]


def node_cmd(node_rank: int, port: int, argv: list[str], nnodes: int = 2) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--node-rank={node_rank}",
        "--nproc-per-node=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=lrtest",
        "-m", "lr_engine.cli", *argv,
    ]


def start_nodes(argv: list[str], env: dict[str, str] | None = None) -> list[subprocess.Popen[str]]:
    port = free_port()
    return [
        subprocess.Popen(node_cmd(i, port, argv), env=subprocess_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
        for i in range(2)
    ]


STUBS = {
    # srun: start the command once per node (in parallel), as Slurm would, and fail if any fails.
    "srun": """#!/bin/bash
nodes=1
while [[ "$1" == --* ]]; do case "$1" in --nodes=*) nodes="${1#--nodes=}";; esac; shift; done
pids=()
for ((i = 0; i < nodes; i++)); do SLURM_NODEID=$i SLURM_PROCID=$i "$@" & pids+=($!); done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
""",
    "scontrol": """#!/bin/bash
[ "$1 $2" = "show hostnames" ] || exit 1
printf '127.0.0.1\n127.0.0.2\n'
""",
    "torchrun": f"""#!/bin/bash
exec {sys.executable} -m torch.distributed.run "$@"
""",
}
GOLDEN = Path(__file__).parent / "golden" / "slurm_hsdp_2x2.sh"


def slurm_script(output_dir: Path, dataset: Path, port: int) -> str:
    from lr_config import LaunchSpec, build_slurm_script, parse_train_config

    cfg = parse_train_config([f"--output_dir={output_dir}", f"--dataset.root={dataset}", *TINY, *HSDP, "--steps=6", "--save_freq=3", "--checkpoint_format=dcp"])
    spec = LaunchSpec(nnodes=2, nproc_per_node=2, rdzv_endpoint=f"127.0.0.1:{port}", gpus_per_node=0, time="00:30:00")
    return build_slurm_script(spec, cfg)


def test_slurm_script_matches_the_golden_file() -> None:
    script = slurm_script(Path("/runs/hsdp"), Path("/data/demo"), 29500)
    if os.environ.get("LR_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(script)
    assert script == GOLDEN.read_text()
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory, demo_dataset: Path) -> Path:
    """The Slurm script, run through stub srun/scontrol on this machine: 2 nodes x 2 processes."""
    tmp = tmp_path_factory.mktemp("nodes")
    out = tmp / "hsdp_2nodes"
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for name, text in STUBS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp / "job.sh").write_text(slurm_script(out, demo_dataset, free_port()))
    env = subprocess_env({"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": "4242"})
    proc = subprocess.run(["bash", str(tmp / "job.sh")], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "across nodes: dp_replicate" in proc.stdout
    return out


def test_two_nodes_match_one_node_step_for_step(two_nodes: Path, tmp_path: Path, demo_dataset: Path) -> None:
    ref = tmp_path / "hsdp_1node"
    proc = run_ranks(4, ["train", f"--output_dir={ref}", f"--dataset.root={demo_dataset}", *TINY, *HSDP, "--steps=6", "--save_checkpoint=false"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert losses(two_nodes) == pytest.approx(losses(ref), rel=1e-6)
    assert grad_norms(two_nodes) == pytest.approx(grad_norms(ref), rel=1e-6)
    step = json.loads((two_nodes / "checkpoints" / "000006" / "training_state" / "training_step.json").read_text())
    assert step["topology"] == {"world_size": 4, "dp_replicate": 2, "dp_shard": 2, "nnodes": 2}


def test_one_node_resumes_the_two_node_checkpoint(two_nodes: Path, tmp_path: Path) -> None:
    config = two_nodes / "checkpoints" / "000003" / "pretrained_model" / "train_config.json"
    out = tmp_path / "resumed_fsdp2"
    proc = run_ranks(
        2,
        ["train", "--resume=true", f"--config_path={config}", f"--output_dir={out}", "--parallelism.dp_replicate=1",
         "--parallelism.dp_shard=2", "--batch_size=4"],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "nodes 2 -> 1" in proc.stdout
    assert len(losses(out)) == 3
    assert losses(out) == pytest.approx(losses(two_nodes)[3:], rel=1e-5)
    assert grad_norms(out) == pytest.approx(grad_norms(two_nodes)[3:], rel=1e-5)


def test_a_lost_node_ends_the_other_without_hanging(tmp_path: Path, demo_dataset: Path) -> None:
    argv = ["train", f"--output_dir={tmp_path / 'lost'}", f"--dataset.root={demo_dataset}", *TINY, *HSDP, "--steps=100000",
            "--save_checkpoint=false"]
    # The collective timeout keeps its default (300 s), far above the bound asserted below: the
    # surviving node must notice the lost peers themselves, not wait for a collective to time out.
    nodes = start_nodes(argv)
    deadline = time.monotonic() + 300
    metrics = tmp_path / "lost" / "metrics.jsonl"
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        assert time.monotonic() < deadline, "the 2-node run never started training"
        assert all(n.poll() is None for n in nodes)
        time.sleep(0.5)
    # The whole node: torchrun starts each worker in its own session, so killing the agent's
    # process group alone would leave node 1's workers training on as orphans.
    lost = [nodes[1].pid, *(c.pid for c in psutil.Process(nodes[1].pid).children(recursive=True))]
    for pid in lost:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    nodes[0].communicate(timeout=180)
    assert nodes[0].returncode != 0
    assert time.monotonic() - killed_at < 60
    nodes[1].wait(timeout=30)


def test_accelerate_launch_across_two_nodes(tmp_path: Path, demo_dataset: Path) -> None:
    """`accelerate launch --num_machines=2 --machine_rank=i ...` as built by lr-config, on loopback."""
    from lr_config import LaunchSpec, build_launch, parse_train_config

    port = free_port()
    cfg = parse_train_config([f"--output_dir={tmp_path / 'acc'}", f"--dataset.root={demo_dataset}", *TINY, *HSDP, "--steps=2",
                              "--save_checkpoint=false"])
    procs = []
    for rank in range(2):
        argv = build_launch(LaunchSpec(launcher="accelerate", nnodes=2, node_rank=rank, nproc_per_node=2, rdzv_endpoint=f"127.0.0.1:{port}"), cfg)
        assert argv[:2] == ["accelerate", "launch"] and f"--machine_rank={rank}" in argv and "--num_machines=2" in argv
        cmd = [sys.executable, "-m", "accelerate.commands.launch", *argv[2:]]
        procs.append(subprocess.Popen(cmd, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True))
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    for p, text in zip(procs, outputs):
        assert p.returncode == 0, text[-3000:]
    assert "HSDP dp_replicate=2 dp_shard=2 world=4 nodes=2x2 (across nodes: dp_replicate)" in outputs[0]
    assert len(losses(tmp_path / "acc")) == 2
