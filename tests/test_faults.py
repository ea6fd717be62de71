"""Faults injected into real processes: nothing hangs and nothing saved is lost.

- A rank SIGKILLed mid-training ends the whole torchrun job, non-zero, within 60 s.
- A SIGKILL of the whole process group at each pause point of a save
  (`LR_TEST_PAUSE_IN_SAVE`, see lr_checkpoint._save) leaves `last` on the previous
  checkpoint, byte-identical and verified, and the run resumes from `last`.
- A full disk during a save (RLIMIT_FSIZE in the child) fails saying so, and leaves the
  previous checkpoint and `last` intact.
- Corrupted bytes in `model.safetensors`, an optimizer DCP shard and a DCP `.metadata`:
  `verify` names the file (the DCP folder and tensor for a shard), and resume refuses
  naming it with the same cause, exit 2.
- A Hub outage mid-push keeps the checkpoint untouched and the publish folder whole, and
  the retry command printed by `lr-publish` lands the push once the Hub is back.

Every run resumes or copies the session's `tiny_run` / `dcp_run` (tests/_support/runs.py).
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from _support.procs import run_cli, subprocess_env
from _support.runs import PLANTED_TOKEN, TINY, TinyRun, copy_run, tree_digest

pytestmark = pytest.mark.multiprocess

PAUSE_POINTS = ("before_shards", "between_shards", "before_rename", "before_last")
ONE_PROCESS = ("--checkpoint_format=safetensors", "--parallelism.dp_shard=-1")
"""Resume dcp_run's sharded checkpoint in one process (a supported change of topology)."""


def _start(cmd: list[str], log: Path, env: dict[str, str] | None = None,
           preexec: Callable[[], None] | None = None) -> subprocess.Popen[bytes]:
    """Start a command in its own session (so the test can kill its whole group), output to `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=subprocess_env(env),
                                start_new_session=True, preexec_fn=preexec)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def _wait_for(what: str, ready: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} before {what}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            _kill_group(proc)
            raise AssertionError(f"no {what} after {timeout} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def _engine(*args: str) -> list[str]:
    return [sys.executable, "-m", "lr_engine.cli", "train", *args]


def _resume_argv(run: Path, *extra: str) -> list[str]:
    return ["--resume=true", f"--config_path={run / 'checkpoints' / 'last'}", f"--output_dir={run}", *extra]


def _metrics_lines(run: Path) -> int:
    path = run / "metrics.jsonl"
    return path.read_text().count("\n") if path.exists() else 0


def _workers(launcher: int) -> list[psutil.Process]:
    """The torchrun workers: children of the launcher running lr_engine.cli."""
    return [p for p in psutil.Process(launcher).children(recursive=True) if "lr_engine.cli" in " ".join(p.cmdline())]


def test_a_killed_rank_ends_the_whole_job_within_a_minute(tmp_path: Path, demo_dataset: Path) -> None:
    """SIGKILL of rank 1 of a 2-process FSDP2 run mid-training: torchrun exits non-zero within 60 s and
    no worker is left.
    """
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "lr_engine.cli",
           "train", f"--output_dir={run}", f"--dataset.root={demo_dataset}", *TINY, "--steps=100000",
           "--save_checkpoint=false", "--parallelism.dp_shard=2"]
    log = tmp_path / "torchrun.log"
    proc = _start(cmd, log)
    try:
        _wait_for("two logged steps", lambda: _metrics_lines(run) >= 2, proc, log)
        workers = _workers(proc.pid)
        assert len(workers) == 2, [w.cmdline() for w in workers]
        victim = next(w for w in workers if w.environ().get("RANK") == "1")
        victim.kill()
        killed = time.monotonic()
        code = proc.wait(timeout=60)
        took = time.monotonic() - killed
    finally:
        _kill_group(proc)
    assert code != 0, log.read_text()[-3000:]
    assert took < 60
    assert not [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture
def copied(tiny_run: TinyRun, tmp_path: Path) -> Path:
    return copy_run(tiny_run, tmp_path / "run")


@pytest.mark.parametrize("point", PAUSE_POINTS)
def test_kill_during_a_save_leaves_last_whole_and_resumable(copied: Path, point: str, tmp_path: Path) -> None:
    """SIGKILL of the process group paused inside a save: `last` still names the previous checkpoint,
    byte-identical and verified; the run resumes from `last` and saves again.
    """
    from lr_checkpoint import verify_checkpoint

    checkpoints = copied / "checkpoints"
    previous = tree_digest(checkpoints / "000004")
    log = tmp_path / "killed.log"
    proc = _start(_engine(*_resume_argv(copied, "--steps=6")), log, env={"LR_TEST_PAUSE_IN_SAVE": point})
    try:
        _wait_for(f"the pause at {point}", (checkpoints / f".paused-{point}").exists, proc, log)
    finally:
        _kill_group(proc)

    assert os.readlink(checkpoints / "last") == "000004"
    assert tree_digest(checkpoints / "000004") == previous
    assert verify_checkpoint(checkpoints / "last") == []
    if point == "before_last":  # renamed and whole; only `last` had not moved yet
        assert verify_checkpoint(checkpoints / "000006") == []
    else:
        assert not (checkpoints / "000006").exists()

    resumed = run_cli(["lr_engine.cli", "train", *_resume_argv(copied, "--steps=6")])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert os.readlink(checkpoints / "last") == "000006"
    assert verify_checkpoint(checkpoints / "last") == []
    assert not [p.name for p in checkpoints.iterdir() if p.name.startswith(".tmp-")]
    # the killed run had logged step 5 (and maybe 6) past the checkpoint it resumed from: those
    # records go before the steps are trained again (they were once listed twice: 1..6, 5, 6)
    steps = [json.loads(line)["step"] for line in (copied / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]


def _file_size_limit(limit: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@dataclass(frozen=True)
class FullDisk:
    checkpoints: Path
    before: dict[str, str]
    code: int
    output: str


@pytest.fixture(scope="module")
def full_disk(tiny_run: TinyRun, tmp_path_factory: pytest.TempPathFactory) -> FullDisk:
    """A resume of tiny_run whose step-6 save hits the file size limit (one run for the tests below)."""
    work = tmp_path_factory.mktemp("full_disk")
    run = copy_run(tiny_run, work / "run")
    checkpoints = run / "checkpoints"
    before = tree_digest(checkpoints)
    model_bytes = (checkpoints / "000004" / "pretrained_model" / "model.safetensors").stat().st_size
    log = work / "full.log"
    # Every file may grow to half the weights: the small files fit, model.safetensors does not.
    proc = _start(_engine(*_resume_argv(run, "--steps=6")), log, preexec=_file_size_limit(model_bytes // 2))
    code = proc.wait(timeout=600)
    return FullDisk(checkpoints=checkpoints, before=before, code=code, output=log.read_text())


def test_a_full_disk_during_a_save_fails_and_loses_nothing(full_disk: FullDisk) -> None:
    """RLIMIT_FSIZE below the weights' size during a save: non-zero exit saying 'File too large'; the
    previous checkpoint and `last` intact and verified.
    """
    from lr_checkpoint import verify_checkpoint

    assert full_disk.code != 0
    assert "File too large" in full_disk.output, full_disk.output[-3000:]
    checkpoints = full_disk.checkpoints
    assert os.readlink(checkpoints / "last") == "000004"
    after = tree_digest(checkpoints)
    assert {k: v for k, v in after.items() if not k.startswith(".tmp-")} == full_disk.before
    assert verify_checkpoint(checkpoints / "last") == []


def test_a_full_disk_during_a_save_names_the_file(full_disk: FullDisk) -> None:
    """The same full disk: one message naming the file being written, no traceback."""
    assert "Traceback" not in full_disk.output
    assert f"{full_disk.checkpoints}/.tmp-000006-" in full_disk.output and "model.safetensors" in full_disk.output


def _flip(path: Path, offset: int, count: int = 8) -> None:
    data = bytearray(path.read_bytes())
    for i in range(offset, offset + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _refusals(step_dir: Path, run: Path, *resume_flags: str) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    """verify's problems, and the resume of the same checkpoint (one process)."""
    from lr_checkpoint import verify_checkpoint

    problems = verify_checkpoint(step_dir)
    resumed = run_cli(["lr_engine.cli", "train", *_resume_argv(run, "--steps=6", *resume_flags)])
    return problems, resumed


def _assert_refused_alike(problems: list[str], resumed: subprocess.CompletedProcess[str], damaged: Path) -> None:
    """verify names `damaged`; resume exits 2 naming it with the same cause (verify's whole problem, or
    for an unreadable DCP tensor the reason verify gives in parentheses)."""
    assert len(problems) == 1 and str(damaged) in problems[0], problems
    assert resumed.returncode == 2, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stdout + resumed.stderr
    cause = problems[0].split(" unreadable (", 1)[-1].removesuffix(")")
    assert str(damaged) in resumed.stderr and cause in resumed.stderr, (cause, resumed.stderr)


def test_corrupt_weights_header_is_named_by_verify_and_resume(copied: Path) -> None:
    """Flipped bytes in model.safetensors' header: verify names the file; resume exits 2 with the same
    message; nothing written.
    """
    model = copied / "checkpoints" / "000004" / "pretrained_model" / "model.safetensors"
    _flip(model, 12)  # inside the JSON header
    before = tree_digest(copied)
    problems, resumed = _refusals(copied / "checkpoints" / "last", copied)
    _assert_refused_alike(problems, resumed, model)
    assert tree_digest(copied) == before


def test_corrupt_weights_data_is_named_by_verify_and_resume(copied: Path) -> None:
    """Flipped bytes inside model.safetensors' tensor data (the file still parses): verify names the
    file through checksums.json; resume exits 2 with the same message; nothing written.
    """
    model = copied / "checkpoints" / "000004" / "pretrained_model" / "model.safetensors"
    _flip(model, model.stat().st_size - 64)  # inside the last tensor's bytes
    before = tree_digest(copied)
    problems, resumed = _refusals(copied / "checkpoints" / "last", copied)
    _assert_refused_alike(problems, resumed, model)
    assert "its checksum does not match checksums.json" in problems[0]
    assert tree_digest(copied) == before


def test_corrupt_optimizer_shard_data_is_named_by_verify_and_resume(copied_dcp: Path) -> None:
    """Flipped bytes inside an optimizer DCP shard's tensor data (DCP still reads it): verify names the
    shard file; resume exits 2 with the same message; nothing written.
    """
    shard = copied_dcp / "checkpoints" / "000004" / "training_state" / "optimizer_0" / "__0_0.distcp"
    _flip(shard, shard.stat().st_size // 2, count=1)
    before = tree_digest(copied_dcp)
    problems, resumed = _refusals(copied_dcp / "checkpoints" / "last", copied_dcp, *ONE_PROCESS)
    _assert_refused_alike(problems, resumed, shard)
    assert tree_digest(copied_dcp) == before


@pytest.fixture
def copied_dcp(dcp_run: TinyRun, tmp_path: Path) -> Path:
    return copy_run(dcp_run, tmp_path / "dcp")


def test_corrupt_dcp_metadata_is_named_by_verify_and_resume(copied_dcp: Path) -> None:
    """Flipped bytes in a DCP .metadata: verify names the file; resume exits 2 with the same message;
    nothing written.
    """
    metadata = copied_dcp / "checkpoints" / "000004" / "pretrained_model" / "pytorch_model_fsdp_0" / ".metadata"
    _flip(metadata, metadata.stat().st_size // 2)
    before = tree_digest(copied_dcp)
    problems, resumed = _refusals(copied_dcp / "checkpoints" / "last", copied_dcp, *ONE_PROCESS)
    _assert_refused_alike(problems, resumed, metadata)
    assert tree_digest(copied_dcp) == before


def test_corrupt_optimizer_shard_is_named_by_verify_and_resume(copied_dcp: Path) -> None:
    """Flipped bytes in an optimizer DCP shard: verify names its DCP folder and the tensor; resume exits 2
    naming the folder with the same cause; nothing written.
    """
    shard = copied_dcp / "checkpoints" / "000004" / "training_state" / "optimizer_0" / "__0_0.distcp"
    _flip(shard, 0)  # the zip's local header
    before = tree_digest(copied_dcp)
    problems, resumed = _refusals(copied_dcp / "checkpoints" / "last", copied_dcp, *ONE_PROCESS)
    _assert_refused_alike(problems, resumed, shard.parent)  # the DCP folder and the tensor: DCP's error has no file
    assert tree_digest(copied_dcp) == before


def _retry_argv(stderr: str) -> list[str]:
    line = stderr.split("Retry the push with:\n", 1)[1].splitlines()[0]
    argv = shlex.split(line)
    assert argv[0] == "lr-publish"
    return argv[1:]


def test_a_hub_outage_mid_push_loses_nothing_and_the_printed_retry_lands_it(copied: Path, hub_server) -> None:
    """The loopback Hub drops the commit and goes down mid-push: exit 1 with a retry command,
    checkpoint byte-identical, publish folder kept; once the Hub is back the printed command
    pushes exactly that folder.
    """
    before = tree_digest(copied / "checkpoints")
    hub_server.outage_on("/commit/")  # the weights went up, the commit is dropped, the Hub goes down
    env = {"HF_TOKEN": PLANTED_TOKEN, "LR_HUB_RETRIES": "2", "LR_HUB_RETRY_BASE_S": "0"}
    failed = run_cli(["lr_publish.cli", f"--checkpoint_dir={copied / 'checkpoints' / 'last'}", "--repo_id=lr-test/tiny",
                      f"--endpoint={hub_server.endpoint}"], env=env)

    assert failed.returncode == 1, failed.stderr[-3000:]
    assert "Traceback" not in failed.stdout + failed.stderr
    assert not hub_server.running
    assert tree_digest(copied / "checkpoints") == before
    argv = _retry_argv(failed.stderr)
    folder = Path(argv[0].removeprefix("--folder="))
    assert folder.parent == copied / "publish"
    built = tree_digest(folder)

    hub_server.start()
    retried = run_cli(["lr_publish.cli", *argv], env=env)
    assert retried.returncode == 0, retried.stderr[-3000:]
    assert hub_server.files("lr-test/tiny") == {p.name: p.read_bytes() for p in folder.iterdir()}
    assert tree_digest(folder) == built
    assert tree_digest(copied / "checkpoints") == before
