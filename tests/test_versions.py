"""`--version` of every command prints the installed versions of lr's packages and torch, exit 0;
`--version=N` stays the train config's schema field (it must not be hijacked either way)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from _support.procs import subprocess_env

COMMANDS = {
    "lr-engine": ["lr_engine.cli"],
    "lr-engine train": ["lr_engine.cli", "train"],
    "lr-checkpoint": ["lr_checkpoint.cli"],
    "lr-publish": ["lr_publish.cli"],
    "lr-tui": ["lr_tui"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_version_prints_the_package_versions(command: str) -> None:
    done = subprocess.run([sys.executable, "-m", *COMMANDS[command], "--version"], env=subprocess_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    prog = command.split()[0]
    lines = done.stdout.splitlines()
    assert lines[0] == f"{prog} {metadata.version(prog)}"
    for package in ("lr-config", "lr-checkpoint", "lr-publish", "lr-engine", "lr-tui", "torch"):
        assert f"  {package} {metadata.version(package)}" in lines


def test_version_with_a_value_is_the_schema_field() -> None:
    from lr_config import TRAIN_CONFIG_VERSION

    future = TRAIN_CONFIG_VERSION + 1  # a version this lr does not read: refused before anything runs
    done = subprocess.run([sys.executable, "-m", "lr_engine.cli", "train", f"--version={future}"], env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and f"--version: train_config schema version {future} is not supported" in done.stderr
