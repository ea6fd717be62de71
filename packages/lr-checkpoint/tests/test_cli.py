"""Bad input to `lr-checkpoint`: one paragraph on stderr, exit 2, no traceback, nothing written.

These run the real console module in a subprocess; none of them imports torch.
"""

from __future__ import annotations

import hashlib
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
