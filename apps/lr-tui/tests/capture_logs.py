"""Capture the logs of real failing runs into tests/data/ (the event parser's fixtures).

Every file here is what real processes printed: `lr-engine train` under torchrun, started
the way the TUI starts it (`real_runs.launch`: `[rankN]:` prefixes, the combined log), and
broken on purpose. Nothing is written by hand.

- killed_rank.log        2 processes, rank 1 SIGKILLed after step 10
- gloo_timeout.log       2 processes, rank 1 SIGSTOPped; rank 0's gloo collective times out (LR_DIST_TIMEOUT_S=5)
- env_guard.log          2 processes with ACCELERATE_USE_FSDP=true in the environment
- stop_resume.log        2 processes stopped with the TUI's stop (SIGINT to the launch's group), then
                         resumed on 1 process with both degrees and --steps=<stopped + 3> (changed settings)
- checkpoint_failed.log  that run resumed with a file-size limit smaller than model.safetensors
- rendezvous_timeout.log node 0 of 2 alone (join_timeout=10)
- rendezvous_unreachable.log node 1 of 2, node 0's address unreachable (read_timeout=10)
- host_oom.log           1 process under a 6 GB address-space limit, a model too big for it
- shell_oom.log          a shell's "Killed" line and Python's MemoryError (what a wrapper script shows)
- torch_strings.txt      NCCL and CUDA out-of-memory messages, read from the installed torch
                         binaries (no GPU here to provoke them)

Run: `OMP_NUM_THREADS=1 python apps/lr-tui/tests/capture_logs.py` (about 6 minutes on 2 cores).
Paths inside the logs are those of the capturing machine; the tests do not depend on them.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from real_runs import TINY, launch, log_text, make_tiny_dataset, quiet_env, wait_for_log, worker_pid  # noqa: E402

from lr_config import LaunchSpec, build_launch, parse_train_config  # noqa: E402
from lr_tui._cli_tasks import resolve_executable, with_rank_logs  # noqa: E402
from lr_tui._resume_plan import last_checkpoint, plan_resume  # noqa: E402
from lr_tui._run_control import liveness, read_launch_record, send_stop  # noqa: E402

DATA = Path(__file__).parent / "data"
FOREVER = "--steps=100000"


def _save(name: str, text: str) -> None:
    DATA.mkdir(exist_ok=True)
    (DATA / name).write_text(text)
    print(f"{name}: {len(text.splitlines())} lines", flush=True)


def killed_rank(ds: Path, out: Path) -> str:
    proc = launch(2, [f"--dataset.root={ds}", *TINY, FOREVER], out)
    wait_for_log(out, "step 10/", proc)
    os.kill(worker_pid(proc.pid, 1), signal.SIGKILL)
    proc.wait(timeout=240)
    return log_text(out)


def gloo_timeout(ds: Path, out: Path) -> str:
    proc = launch(2, [f"--dataset.root={ds}", *TINY, FOREVER], out, env={"LR_DIST_TIMEOUT_S": "5", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5"})
    wait_for_log(out, "step 10/", proc)
    stopped = worker_pid(proc.pid, 1)
    os.kill(stopped, signal.SIGSTOP)
    try:
        proc.wait(timeout=240)
    finally:
        if Path(f"/proc/{stopped}").exists():
            os.kill(stopped, signal.SIGKILL)
    return log_text(out)


def env_guard(ds: Path, out: Path) -> str:
    proc = launch(2, [f"--dataset.root={ds}", *TINY, "--steps=5"], out, env={"ACCELERATE_USE_FSDP": "true"})
    proc.wait(timeout=240)
    return log_text(out)


def stop_resume(ds: Path, out: Path) -> str:
    proc = launch(2, [f"--dataset.root={ds}", *TINY, FOREVER], out)
    wait_for_log(out, "step 10/", proc)
    print("  stop:", send_stop(liveness(read_launch_record(out), None), 0), flush=True)
    proc.wait(timeout=240)
    step_dir = last_checkpoint(out)
    assert step_dir is not None
    steps = int(step_dir.name) + 3
    plan = plan_resume(LaunchSpec(nproc_per_node=1), step_dir, ["--parallelism.dp_replicate=1", "--parallelism.dp_shard=1", f"--steps={steps}"], out)
    assert plan.argv is not None, plan.problems
    from lr_tui._cli_tasks import start_training

    start_training(plan.argv, out, extra_env={"OMP_NUM_THREADS": "1"}).wait(timeout=240)
    return log_text(out)


def _limited(apply: Callable[[], None], argv: list[str], log: Path) -> None:
    with log.open("wb") as f:
        subprocess.run([resolve_executable(argv[0]), *argv[1:]], stdout=f, stderr=subprocess.STDOUT, env=quiet_env(),
                       preexec_fn=apply, timeout=300, check=False)


def checkpoint_failed(run: Path, work: Path) -> str:
    step_dir = last_checkpoint(run)
    assert step_dir is not None
    limit = (step_dir / "pretrained_model" / "model.safetensors").stat().st_size // 2
    plan = plan_resume(LaunchSpec(nproc_per_node=1), step_dir, [f"--steps={int(step_dir.name) + 2}"], work / "ranks")
    assert plan.argv is not None, plan.problems
    log = work / "checkpoint_failed.log"
    _limited(lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)), plan.argv, log)
    return log.read_text(errors="replace")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rendezvous(ds: Path, out: Path, spec: LaunchSpec, conf: str) -> str:
    argv = with_rank_logs(build_launch(spec, parse_train_config([f"--output_dir={out}", f"--dataset.root={ds}", *TINY, "--steps=5"])), out)
    argv.insert(argv.index("-m"), f"--rdzv-conf={conf}")
    log = out.parent / f"{out.name}.log"
    _limited(lambda: None, argv, log)
    return log.read_text(errors="replace")


def rendezvous_timeout(ds: Path, out: Path) -> str:
    spec = LaunchSpec(nnodes=2, node_rank=0, nproc_per_node=1, rdzv_endpoint=f"127.0.0.1:{_free_port()}")
    return _rendezvous(ds, out, spec, "join_timeout=10")


def rendezvous_unreachable(ds: Path, out: Path) -> str:
    spec = LaunchSpec(nnodes=2, node_rank=1, nproc_per_node=1, rdzv_endpoint="192.0.2.1:29500")  # TEST-NET-1: never answers
    return _rendezvous(ds, out, spec, "read_timeout=10")


def host_oom(ds: Path, out: Path) -> str:
    big = ["--policy.dim_model=8192", "--policy.dim_feedforward=32768", "--policy.n_heads=8", "--batch_size=8", "--steps=5"]
    argv = with_rank_logs(build_launch(LaunchSpec(nproc_per_node=1), parse_train_config([f"--output_dir={out}", f"--dataset.root={ds}", *big])), out)
    log = out.parent / "host_oom.log"
    limit = 6 * 2**30
    _limited(lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)), argv, log)
    return log.read_text(errors="replace")


SHELL_OOM = """\
{python} -c 'import os, signal; os.kill(os.getpid(), signal.SIGKILL)'
{python} -c 'import resource; resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30)); bytearray(2**31)'
"""


def shell_oom(work: Path) -> str:
    script = work / "wrapper.sh"
    script.write_text(SHELL_OOM.format(python=sys.executable))
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120, env=quiet_env())
    return done.stdout + done.stderr


_WANTED = (b"CUDA out of memory", b"Watchdog caught collective operation timeout", b"NCCL error", b"ncclRemoteError",
           b"ncclSystemError", b"NCCL communicator was aborted")
_PRINTABLE = re.compile(rb"[ -~]*")


def _strings_with(data: bytes, needle: bytes) -> set[str]:
    """The printable runs of `data` that contain `needle` (what `strings | grep` shows)."""
    found: set[str] = set()
    at = data.find(needle)
    while at >= 0:
        start = at
        while start > 0 and 32 <= data[start - 1] < 127:
            start -= 1
        match = _PRINTABLE.match(data, start)
        assert match is not None
        found.add(match.group(0).decode())
        at = data.find(needle, match.end())
    return found


def torch_strings() -> str:
    """Messages the parser knows, as the installed torch binaries hold them."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.submodule_search_locations
    lib = Path(spec.submodule_search_locations[0]) / "lib"
    found: set[str] = set()
    for name in ("libc10_cuda.so", "libtorch_cuda.so"):
        data = (lib / name).read_bytes()
        for needle in _WANTED:
            found |= _strings_with(data, needle)
    return "\n".join(sorted(found)) + "\n"


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="lr-tui-capture-"))
    try:
        ds = make_tiny_dataset(work / "ds")
        started = time.monotonic()
        _save("killed_rank.log", killed_rank(ds, work / "killed"))
        _save("gloo_timeout.log", gloo_timeout(ds, work / "gloo"))
        _save("env_guard.log", env_guard(ds, work / "env"))
        _save("stop_resume.log", stop_resume(ds, work / "stop"))
        _save("checkpoint_failed.log", checkpoint_failed(work / "stop", work))
        _save("rendezvous_timeout.log", rendezvous_timeout(ds, work / "rdzv0"))
        _save("rendezvous_unreachable.log", rendezvous_unreachable(ds, work / "rdzv1"))
        _save("host_oom.log", host_oom(ds, work / "oom"))
        _save("shell_oom.log", shell_oom(work))
        _save("torch_strings.txt", torch_strings())
        print(f"captured in {time.monotonic() - started:.0f}s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
