"""The torch-free parts: import weight, safetensors header checks, the restricted DCP parser."""

from __future__ import annotations

import json
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from lr_checkpoint import CheckpointError, resolve_step_dir
from lr_checkpoint._formats.dcp.metadata import read_dcp_metadata
from lr_config.st_format import TensorSpec, build_header, read_header
from lr_config import ConfigError


def test_import_does_not_import_torch() -> None:
    code = "import sys, lr_checkpoint; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_the_torch_free_modules_import_no_torch() -> None:
    """The converter, inspect, resume phase 1 and the CLI run without torch: neither they nor
    the sub-package `__init__` files on their way import a module that needs it."""
    light = ["lr_checkpoint.cli", "lr_checkpoint._convert", "lr_checkpoint._inspect", "lr_checkpoint._resume",
             "lr_checkpoint._formats.safetensors.body", "lr_checkpoint._io.checksums", "lr_checkpoint._ranks"]
    code = f"import importlib, sys; [importlib.import_module(m) for m in {light!r}]; sys.exit(1 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_checkpoint_error_is_a_config_error() -> None:
    assert issubclass(CheckpointError, ConfigError)


def write(path: Path, header: bytes, data: bytes) -> Path:
    path.write_bytes(header + data)
    return path


def test_header_round_trip_and_size_checks(tmp_path: Path) -> None:
    specs = [TensorSpec("a", "float32", (2, 3)), TensorSpec("b", "bfloat16", (4,)), TensorSpec("c", "int64", ())]
    header = build_header(specs, {"format": "pt"})
    assert (len(header) - 8) % 8 == 0
    good = write(tmp_path / "good.safetensors", header, bytes(24 + 8 + 8))
    parsed = read_header(good)
    assert parsed.shapes() == {"a": (2, 3), "b": (4,), "c": ()} and parsed.metadata == {"format": "pt"}
    with pytest.raises(CheckpointError, match="truncated or padded file: the header promises 40 bytes of tensor data, the file holds 39"):
        read_header(write(tmp_path / "short.safetensors", header, bytes(39)))
    with pytest.raises(CheckpointError, match="truncated safetensors file"):
        read_header(write(tmp_path / "tiny.safetensors", b"\x01\x02", b""))
    with pytest.raises(CheckpointError, match="header of 4096 bytes in a 20-byte file"):
        read_header(write(tmp_path / "long.safetensors", struct.pack("<Q", 4096), bytes(12)))


def test_header_with_gaps_or_bad_shapes_is_corrupt(tmp_path: Path) -> None:
    def raw(entries: dict[str, object]) -> bytes:
        text = json.dumps(entries).encode()
        return struct.pack("<Q", len(text)) + text

    gap = {"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}
    with pytest.raises(CheckpointError, match="overlap or leave gaps"):
        read_header(write(tmp_path / "gap.safetensors", raw(gap), bytes(8)))
    wrong = {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}
    with pytest.raises(CheckpointError, match="does not match its shape and dtype"):
        read_header(write(tmp_path / "wrong.safetensors", raw(wrong), bytes(8)))
    with pytest.raises(CheckpointError, match="corrupt safetensors header"):
        read_header(write(tmp_path / "json.safetensors", struct.pack("<Q", 4) + b"{no}", b""))


def test_restricted_parser_refuses_foreign_pickles(tmp_path: Path) -> None:
    for payload in (pickle.dumps({"x": 1}), pickle.dumps(Path), b"\x80\x04truncated"):
        (tmp_path / ".metadata").write_bytes(payload)
        with pytest.raises(CheckpointError, match="not a valid DCP metadata file"):
            read_dcp_metadata(tmp_path)


def test_resolve_names_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        resolve_step_dir(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last").symlink_to("000100")
    with pytest.raises(CheckpointError, match="the `last` link points to '000100', which does not exist"):
        resolve_step_dir(tmp_path / "checkpoints")
