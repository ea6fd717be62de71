"""Bad input to `lr-checkpoint`: one paragraph on stderr, exit 2, no traceback, nothing written.

These run the real console module in a subprocess; none of them imports torch. Write
failures during convert (a full disk, a read-only folder) are bad input too: exit 2, the
file named, nothing existing changed and no temporary file left.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def refused(cli, args: list[str], *expected: str) -> None:  # type: ignore[no-untyped-def]
    done = cli(["lr_checkpoint.cli", *args])
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == "" and "Traceback" not in done.stderr
    message = done.stderr.strip()
    assert message.startswith("lr-checkpoint: error: ") and "\n\n" not in message
    for text in expected:
        assert text in message, message


def test_bad_input_exits_2_with_one_clear_paragraph(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    empty = tmp_path / "empty"
    empty.mkdir()
    step = tmp_path / "run" / "checkpoints" / "000010"
    (step / "training_state").mkdir(parents=True)
    unfinished = tmp_path / "run" / "checkpoints" / ".tmp-000020-abcd"
    (unfinished / "training_state").mkdir(parents=True)
    before = tree_digest(tmp_path)
    refused(cli, ["inspekt", str(empty)], "unknown command 'inspekt'", "did you mean 'inspect'")
    refused(cli, ["convert", "--checkpoint_dri=x"], "unknown flag --checkpoint_dri", "did you mean 'checkpoint_dir'")
    refused(cli, ["convert"], "pass --checkpoint_dir=DIR")
    refused(cli, ["convert", f"--checkpoint_dir={step}", "--overwrite=maybe"], "--overwrite: expected true or false")
    refused(cli, ["convert", f"--checkpoint_dir={step}", "--dtype=fp8"], "--dtype: expected one of fp32, bf16, fp16")
    refused(cli, ["convert", f"--checkpoint_dir={step}"], "has no DCP model shards")
    refused(cli, ["verify", str(tmp_path / "missing")], "missing: no such file or folder")
    refused(cli, ["inspect", str(empty)], "not a checkpoint")
    refused(cli, ["inspect", str(tmp_path / "run" / "checkpoints")], "has no `last` link, pass one of its step folders (000010)")
    refused(cli, ["verify", str(unfinished)], "an unfinished save")
    refused(cli, ["verify", str(step), str(step)], "unexpected argument")
    assert tree_digest(tmp_path) == before


def test_refused_overwrite_leaves_the_file_alone(ckpt_runs: Path, copy_step, cli) -> None:  # type: ignore[no-untyped-def]
    root = copy_step("fsdp_safetensors_dcp")
    before = tree_digest(root)
    refused(cli, ["convert", f"--checkpoint_dir={root}"], "model.safetensors: already exists; pass --overwrite=true")
    assert tree_digest(root) == before


@pytest.mark.parametrize("args", [["--help"], ["convert", "--help"], []])
def test_help_exits_0(cli, args: list[str]) -> None:  # type: ignore[no-untyped-def]
    done = cli(["lr_checkpoint.cli", *args])
    assert done.returncode == 0 and "usage: lr-checkpoint COMMAND" in done.stdout and "--delete_dcp" in done.stdout


def _dcp_step(root: Path) -> Path:
    """A step folder with DCP model shards only (one process, no torchrun), about 256 KB of weights."""
    import torch
    from torch.distributed.checkpoint.state_dict_saver import save

    tensors = {f"layers.{i}.weight": torch.full((128, 128), float(i)) for i in range(4)}
    save(tensors, checkpoint_id=str(root / "pretrained_model" / "pytorch_model_fsdp_0"), no_dist=True)
    return root


def _convert_with(args: list[str], preexec) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    from _support.procs import subprocess_env

    return subprocess.run([sys.executable, "-m", "lr_checkpoint.cli", "convert", *args], env=subprocess_env(),
                          capture_output=True, text=True, timeout=120, preexec_fn=preexec)


def _assert_refused_cleanly(done: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    message = done.stderr.strip()
    assert message.startswith("lr-checkpoint: error: ") and "\n" not in message, message
    for text in expected:
        assert text in message, message


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("existing", [False, True], ids=["new", "overwrite"])
def test_a_full_disk_during_convert_exits_2_and_changes_nothing(cli, tmp_path: Path, existing: bool) -> None:  # type: ignore[no-untyped-def]
    """RLIMIT_FSIZE below the output's size (a full disk alike; it stops root too): exit 2 naming
    the file and the folder, no traceback, and the step folder byte for byte as it was: no
    temporary file left, an existing model.safetensors (--overwrite=true) untouched."""
    import resource

    root = _dcp_step(tmp_path / "000001")
    model = root / "pretrained_model" / "model.safetensors"
    args = [f"--checkpoint_dir={root}"]
    if existing:
        assert cli(["lr_checkpoint.cli", "convert", *args]).returncode == 0
        args.append("--overwrite=true")
    before = tree_digest(tmp_path)
    limit = 64 * 1024  # the output is about 256 KB

    done = _convert_with(args, lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))

    _assert_refused_cleanly(done, f"cannot write {model} (File too large)", f"free space on the disk of {model.parent}",
                            "the partial file, if any, was removed")
    if existing:
        assert "the existing model.safetensors is unchanged" in done.stderr
    assert tree_digest(tmp_path) == before


@contextlib.contextmanager
def _unwritable(folder: Path):  # type: ignore[no-untyped-def]
    """`folder` refuses new files: chmod for a user; for root (whom chmod does not stop) the
    immutable attribute, skipped where the filesystem or the container refuses it."""
    if os.geteuid() != 0:
        mode = folder.stat().st_mode
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(mode)
        return
    chattr = shutil.which("chattr")
    done = subprocess.run([chattr, "+i", str(folder)], capture_output=True, text=True) if chattr else None
    if done is None or done.returncode != 0:
        pytest.skip("running as root, where chmod does not stop writes, and `chattr +i` (the other way to make a "
                    f"folder unwritable for root) is not available here: {done.stderr.strip() if done else 'no chattr'}")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(folder)], check=True)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_convert_into_a_read_only_folder_exits_2_and_writes_nothing(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = _dcp_step(tmp_path / "000001")
    model = root / "pretrained_model" / "model.safetensors"
    before = tree_digest(tmp_path)
    with _unwritable(model.parent):
        done = cli(["lr_checkpoint.cli", "convert", f"--checkpoint_dir={root}"])
    _assert_refused_cleanly(done, f"cannot write {model} (", f"make {model.parent} writable")
    assert tree_digest(tmp_path) == before
