"""DCP model shards -> model.safetensors: equal to a gathered save, streaming, refusing to clobber."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import lr_checkpoint as lc

pytestmark = pytest.mark.multiprocess


def gathered(ckpt_runs: Path) -> dict[str, torch.Tensor]:
    """The model.safetensors the FSDP2 run gathered at save time (safetensors_dcp)."""
    return load_file(str(ckpt_runs / "fsdp_safetensors_dcp" / "checkpoints" / "000003" / "pretrained_model" / "model.safetensors"))


def assert_same(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key


def test_converted_weights_equal_the_gathered_save(ckpt_runs: Path, copy_step) -> None:  # type: ignore[no-untyped-def]
    root = copy_step("fsdp_dcp")
    written = lc.convert_checkpoint(root.parent / "last")
    assert written == root.resolve() / "pretrained_model" / "model.safetensors"
    assert_same(load_file(str(written)), gathered(ckpt_runs))
    assert [p.name for p in written.parent.iterdir() if p.name.startswith(".")] == []


def test_bf16_export_casts_floating_tensors(ckpt_runs: Path, copy_step) -> None:  # type: ignore[no-untyped-def]
    root = copy_step("fsdp_dcp")
    written = lc.convert_checkpoint(root / "pretrained_model", dtype="bf16")
    assert_same(load_file(str(written)), {k: v.to(torch.bfloat16) for k, v in gathered(ckpt_runs).items()})


def test_refuses_to_overwrite_without_the_flag(copy_step) -> None:  # type: ignore[no-untyped-def]
    root = copy_step("fsdp_safetensors_dcp")
    target = root / "pretrained_model" / "model.safetensors"
    before = target.read_bytes()
    with pytest.raises(lc.CheckpointError, match="model.safetensors: already exists; pass --overwrite=true"):
        lc.convert_checkpoint(root, dtype="fp16")
    assert target.read_bytes() == before
    lc.convert_checkpoint(root, dtype="fp16", overwrite=True)
    assert all(v.dtype == torch.float16 for v in load_file(str(target)).values())


def test_a_damaged_checksums_file_stops_the_conversion_before_anything_changes(copy_step) -> None:  # type: ignore[no-untyped-def]
    """checksums.json is read while the shards copy: a damaged one must still be found before
    model.safetensors is replaced (the error says nothing changed, so nothing may have)."""
    root = copy_step("fsdp_safetensors_dcp")
    target = root / "pretrained_model" / "model.safetensors"
    (root / "checksums.json").write_text('{"version": 1, "files": {')
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    with pytest.raises(lc.CheckpointError, match="checksums.json: not valid JSON"):
        lc.convert_checkpoint(root, dtype="bf16", overwrite=True)
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    assert target.exists()


def test_a_checkpoint_without_shards_is_a_clear_error(copy_step) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(lc.CheckpointError, match=r"has no DCP model shards \(pytorch_model_fsdp_0/\) to convert \(it already has model.safetensors\)"):
        lc.convert_checkpoint(copy_step("fsdp_safetensors"))


def test_delete_dcp_keeps_a_resumable_checkpoint(ckpt_runs: Path, copy_step) -> None:  # type: ignore[no-untyped-def]
    from ckpt_toy import assert_matches, make_model, make_optimizer

    root = copy_step("fsdp_dcp")
    with pytest.raises(lc.CheckpointError, match="--delete_dcp=true needs --dtype=fp32"):
        lc.convert_checkpoint(root, dtype="bf16", delete_dcp=True)
    lc.convert_checkpoint(root, delete_dcp=True)
    assert not (root / "pretrained_model" / "pytorch_model_fsdp_0").exists()
    assert lc.verify_checkpoint(root) == []
    model = make_model(30)
    optimizer = make_optimizer(model)
    lc.load_model_and_optimizer(root, model, optimizer)  # weights from safetensors, optimizer from DCP
    assert_matches(ckpt_runs / "ref_fsdp.safetensors", model, optimizer, "after convert --delete_dcp")


def test_cli_converts_through_the_last_link(ckpt_runs: Path, copy_step, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    from lr_checkpoint.cli import main

    root = copy_step("fsdp_dcp")
    assert main(["convert", str(root.parent / "last"), "--dtype=fp32"]) == 0  # the folder as a positional argument, as inspect and verify take it
    assert capsys.readouterr().out.startswith("wrote ")
    assert_same(load_file(str(root / "pretrained_model" / "model.safetensors")), gathered(ckpt_runs))


MEASURE = """
import resource, sys
from lr_checkpoint.cli import main
def peak_mb(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
assert main(["convert", "--checkpoint_dir=" + sys.argv[1]]) == 0  # warm-up: imports and DCP code paths
baseline = peak_mb()
assert main(["convert", "--checkpoint_dir=" + sys.argv[2]]) == 0
print(peak_mb() - baseline)
"""


def _dcp_step(root: Path, tensors: dict[str, torch.Tensor]) -> Path:
    from torch.distributed.checkpoint.state_dict_saver import save

    save(tensors, checkpoint_id=str(root / "pretrained_model" / "pytorch_model_fsdp_0"), no_dist=True)
    return root


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_cli_conversion_memory_stays_near_one_tensor(tmp_path: Path) -> None:
    from _support.procs import subprocess_env

    tiny = _dcp_step(tmp_path / "tiny", {"w": torch.ones(4)})
    big = _dcp_step(tmp_path / "big", {f"layers.{i}.weight": torch.full((1024, 1024), float(i)) for i in range(24)})  # 96 MB
    done = subprocess.run([sys.executable, "-c", MEASURE, str(tiny), str(big)], env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr
    rise_mb = float(done.stdout.split()[-1])
    # Loading everything first would need >= 96 MB above the baseline; streaming needs about
    # one 4 MB tensor plus DCP's read buffers.
    assert rise_mb < 40, f"peak RSS rose {rise_mb:.1f} MB converting a 96 MB checkpoint"
    weights = load_file(str(big / "pretrained_model" / "model.safetensors"))
    assert len(weights) == 24 and torch.equal(weights["layers.7.weight"], torch.full((1024, 1024), 7.0))


def test_dcp_only_checkpoint_points_to_convert(ckpt_runs: Path, copy_step) -> None:  # type: ignore[no-untyped-def]
    root = copy_step("fsdp_dcp")
    with pytest.raises(lc.CheckpointError, match=rf"only DCP shards .*run `lr-checkpoint convert {root.resolve()}` first"):
        lc.model_weights_file(root / "pretrained_model")
    lc.convert_checkpoint(root)
    assert lc.model_weights_file(root.parent / "last") == root.resolve() / "pretrained_model" / "model.safetensors"


NO_TORCH = """
import sys
from lr_checkpoint.cli import main
code = main(["convert", "--checkpoint_dir=" + sys.argv[1], "--dtype=" + sys.argv[2]])
print("torch imported:", sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))[:3])
sys.exit(code)
"""


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_convert_never_imports_torch(ckpt_runs: Path, copy_step, dtype: str) -> None:  # type: ignore[no-untyped-def]
    """The converter copies (and casts) shard bytes without torch: no 3 s, 600 MB import."""
    from _support.procs import subprocess_env

    root = copy_step("fsdp_dcp")
    done = subprocess.run([sys.executable, "-c", NO_TORCH, str(root), dtype], env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "torch imported: []" in done.stdout, done.stdout
    expected = gathered(ckpt_runs) if dtype == "fp32" else {k: v.to(torch.bfloat16) for k, v in gathered(ckpt_runs).items()}
    assert_same(load_file(str(root / "pretrained_model" / "model.safetensors")), expected)


@pytest.mark.parametrize(("direct", "buffer_bytes"), [(False, 4096), (True, 1000), (True, 3 << 20)])
def test_every_io_mode_and_buffer_size_writes_the_same_file(copy_step, tmp_path: Path, direct: bool, buffer_bytes: int) -> None:  # type: ignore[no-untyped-def]
    """A buffered writer (where O_DIRECT is refused) and buffers smaller than a tensor (pieces
    split inside tensors, at unaligned offsets) write the file the default conversion writes."""
    from lr_checkpoint._convert import _specs
    from lr_checkpoint._formats.dcp.metadata import read_whole_dcp_metadata
    from lr_checkpoint._formats.dcp.stream import dcp_safetensors_body
    from lr_checkpoint._formats.safetensors.body import write_safetensors_body

    root = copy_step("fsdp_dcp")
    written = lc.convert_checkpoint(root, dtype="fp16")
    meta = read_whole_dcp_metadata(root / "pretrained_model" / "pytorch_model_fsdp_0")
    specs = _specs(meta, "fp16")
    other = tmp_path / "other.safetensors"
    body = dcp_safetensors_body(meta, specs, buffer_bytes=buffer_bytes)
    write_safetensors_body(other, specs, body, {"format": "pt"}, direct=direct)
    assert other.read_bytes() == written.read_bytes()


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_a_layout_lr_never_writes_still_converts(ckpt_runs: Path, tmp_path: Path, dtype: str) -> None:
    """DCP shards from elsewhere: a weight split along dim 1 (read through DCP's loader), a bf16
    weight in uneven row blocks and a replicated int buffer (byte copy, cast or not)."""
    import shutil

    from lr_checkpoint._convert import _specs
    from lr_checkpoint._formats.dcp.metadata import read_whole_dcp_metadata
    from lr_checkpoint._formats.dcp.stream import _plan, _Whole

    root = tmp_path / "000001"
    shutil.copytree(ckpt_runs / "foreign" / "000001", root)
    meta = read_whole_dcp_metadata(root / "pretrained_model" / "pytorch_model_fsdp_0")
    assert [p.key for p in _plan(meta, _specs(meta, dtype)) if isinstance(p, _Whole)] == ["cols.weight"]
    full = torch.load(ckpt_runs / "foreign_full.pt")
    target = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    written = lc.convert_checkpoint(root, dtype=dtype)
    assert_same(load_file(str(written)), {k: v.to(target) if v.is_floating_point() else v for k, v in full.items()})
