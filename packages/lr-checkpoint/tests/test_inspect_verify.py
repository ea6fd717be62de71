"""inspect (headers only) and verify (every byte) on whole, truncated and incomplete checkpoints."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import lr_checkpoint as lc

pytestmark = pytest.mark.multiprocess


def truncate(path: Path, keep: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(keep)


@pytest.mark.parametrize("name", ["fsdp_safetensors", "fsdp_dcp", "fsdp_safetensors_dcp", "ddp", "single"])
def test_whole_checkpoints_verify(ckpt_runs: Path, name: str) -> None:
    assert lc.verify_checkpoint(ckpt_runs / name / "checkpoints") == []


def test_inspect_reports_step_layout_and_tensors(ckpt_runs: Path) -> None:
    report = lc.inspect_checkpoint(ckpt_runs / "fsdp_safetensors_dcp" / "checkpoints")
    assert (report["step"], report["format"], report["precision"]) == (3, "safetensors_dcp", "no")
    assert report["topology"]["layout"] == "fsdp2" and report["topology"]["dp_shard"] == 2
    model = {s["kind"]: s for s in report["model"]}
    assert model["safetensors"]["tensors"] == model["dcp"]["tensors"] == 11  # 3 blocks x (weight, bias, scale) + head
    assert model["safetensors"]["bytes"] == model["dcp"]["bytes"] == 4 * (3 * (18 * 18 + 18 + 18) + 18 * 5 + 5)
    assert report["optimizer"][0]["tensors"] == 8 * 3  # step, exp_avg, exp_avg_sq per parameter
    assert report["problems"] == []
    assert {"path": "pretrained_model/config.json", "bytes": (Path(report["path"]) / "pretrained_model/config.json").stat().st_size} in report["files"]


def test_truncated_safetensors_is_reported_and_refused(copy_step) -> None:  # type: ignore[no-untyped-def]
    root = copy_step("fsdp_safetensors")
    weights = root / "pretrained_model" / "model.safetensors"
    truncate(weights, weights.stat().st_size - 100)
    problems = lc.verify_checkpoint(root)
    assert len(problems) == 1 and str(weights) in problems[0] and "truncated" in problems[0]
    assert lc.inspect_checkpoint(root)["problems"] == problems
    from ckpt_toy import make_model

    with pytest.raises(lc.CheckpointError, match="truncated or padded file"):
        lc.load_model_and_optimizer(root, make_model(0))


def test_checksums_name_flipped_bytes_that_still_parse(copy_step) -> None:  # type: ignore[no-untyped-def]
    """Every file of a save is in checksums.json; a flipped byte inside tensor data (which parses and
    loads) is named by verify and refused by load; an entry leaving the folder is refused; a step
    folder without checksums.json is checked structurally only."""
    import json

    root = copy_step("fsdp_safetensors_dcp")
    sums = json.loads((root / "checksums.json").read_text())
    on_disk = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name != "checksums.json")
    assert sums["version"] == 2 and sorted(sums["files"]) == on_disk
    weights = root / "pretrained_model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x01
    weights.write_bytes(bytes(data))
    problems = lc.verify_checkpoint(root)
    assert problems == [f"{weights}: its bytes differ from the save (its checksum does not match checksums.json); "
                        "the file is damaged: resume from another checkpoint"]
    from ckpt_toy import make_model

    # resume reads the gathered weights of a `safetensors` checkpoint (those of
    # `safetensors_dcp` only verify and publish read: see the test below)
    gathered = copy_step("fsdp_safetensors")
    read_weights = gathered / "pretrained_model" / "model.safetensors"
    data = bytearray(read_weights.read_bytes())
    data[-3] ^= 0x01
    read_weights.write_bytes(bytes(data))
    with pytest.raises(lc.CheckpointError) as refused:
        lc.load_model_and_optimizer(gathered, make_model(0))
    assert str(refused.value) == lc.verify_checkpoint(gathered)[0] == problems[0].replace(str(weights), str(read_weights))
    sums["files"]["../../outside"] = {"size": 1, "sha256": "0" * 64, "crc32": "0" * 8}
    (root / "checksums.json").write_text(json.dumps(sums))
    assert any("entry '../../outside' points outside the checkpoint" in p for p in lc.verify_checkpoint(root))
    (root / "checksums.json").unlink()
    assert lc.verify_checkpoint(root) == []


def test_resume_checks_the_crc32_and_verify_both_digests(copy_step) -> None:  # type: ignore[no-untyped-def]
    """A damaged CRC-32 entry alone fails resume (its check); a damaged SHA-256 entry alone passes
    resume but fails verify, which compares both. A checksums.json of version 1 (no CRC-32) is
    upgraded on load, and resume then checks the SHA-256: a flipped byte is still refused."""
    import json

    from ckpt_toy import make_model, make_optimizer

    root = copy_step("fsdp_safetensors")
    path = root / "checksums.json"
    saved = json.loads(path.read_text())
    weights = "pretrained_model/model.safetensors"
    assert re.fullmatch(r"[0-9a-f]{8}", saved["files"][weights]["crc32"])

    def with_entry(**changes: str) -> None:
        sums = json.loads(json.dumps(saved))
        sums["files"][weights].update(changes)
        path.write_text(json.dumps(sums))

    def resume() -> None:
        model = make_model(0)
        lc.load_model_and_optimizer(root, model, make_optimizer(model))

    with_entry(crc32="00000000")
    with pytest.raises(lc.CheckpointError, match="model.safetensors: its bytes differ from the save"):
        resume()
    with_entry(sha256="0" * 64)
    resume()
    assert [p.split(":")[0] for p in lc.verify_checkpoint(root)] == [str(root / weights)]

    with_entry(crc32="", sha256="")  # a hand-edited entry: named, not a crash
    assert lc.verify_checkpoint(root) == [f"{path}: entry {weights!r} has neither a SHA-256 nor a CRC-32; the file is damaged"]

    v1 = {"version": 1, "files": {name: {"size": e["size"], "sha256": e["sha256"]} for name, e in saved["files"].items()}}
    path.write_text(json.dumps(v1))
    resume()
    assert lc.verify_checkpoint(root) == []
    data = bytearray((root / weights).read_bytes())
    data[-3] ^= 0x01
    (root / weights).write_bytes(bytes(data))
    with pytest.raises(lc.CheckpointError, match="model.safetensors: its bytes differ from the save"):
        resume()


def test_truncated_and_missing_dcp_shards_are_reported(copy_step) -> None:  # type: ignore[no-untyped-def]
    root = copy_step("fsdp_dcp")
    model_shard = root / "pretrained_model" / "pytorch_model_fsdp_0" / "__1_0.distcp"
    truncate(model_shard, 1000)
    (root / "training_state" / "optimizer_0" / "__0_0.distcp").unlink()
    problems = lc.verify_checkpoint(root)
    assert any(str(model_shard) in p and "truncated shard" in p for p in problems)
    assert any("optimizer_0/__0_0.distcp: shard file missing" in p for p in problems)
    from ckpt_toy import make_model

    with pytest.raises(lc.CheckpointError, match="truncated shard"):
        lc.load_model_and_optimizer(root, make_model(0))


def test_damaged_shard_bytes_are_a_clear_error(copy_step) -> None:  # type: ignore[no-untyped-def]
    root = copy_step("fsdp_dcp")
    shard = root / "training_state" / "optimizer_0" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[200:2200] = bytes(2000)  # same size, garbage inside
    shard.write_bytes(bytes(data))
    problems = lc.verify_checkpoint(root)
    assert problems and all("optimizer_0: tensor" in p and "unreadable" in p for p in problems)
    from ckpt_toy import make_model, make_optimizer

    model = make_model(0)
    with pytest.raises(lc.CheckpointError, match="optimizer_0: the DCP shards could not be read .* run `lr-checkpoint verify"):
        lc.load_model_and_optimizer(root, model, make_optimizer(model))


def test_incomplete_checkpoint_lists_each_missing_file(copy_step) -> None:  # type: ignore[no-untyped-def]
    root = copy_step("fsdp_safetensors")
    (root / "training_state" / "training_step.json").unlink()
    shutil.rmtree(root / "training_state" / "optimizer_0")  # a sharded run's optimizer: DCP in every format
    (root / "training_state" / "scheduler_state.json").write_text("{not json")
    problems = lc.verify_checkpoint(root)
    assert any("training_step.json: file not found" in p for p in problems)
    assert any("scheduler_state.json: not valid JSON" in p for p in problems)
    with pytest.raises(lc.CheckpointError, match="training_step.json: file not found"):
        lc.read_resume_state(root)
    from ckpt_toy import make_model, make_optimizer

    model = make_model(0)
    with pytest.raises(lc.CheckpointError, match="neither optimizer_state.safetensors nor optimizer_0/"):
        lc.load_model_and_optimizer(root, model, make_optimizer(model))


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (f"touch {self.marker}",))


def test_hostile_dcp_metadata_is_never_unpickled(copy_step, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = copy_step("fsdp_dcp")
    marker = tmp_path / "pwned"
    (root / "pretrained_model" / "pytorch_model_fsdp_0" / ".metadata").write_bytes(pickle.dumps(_Exploit(marker)))
    problems = lc.verify_checkpoint(root)
    assert any("not a valid DCP metadata file (refers to posix.system, a class lr's restricted reader does not know" in p for p in problems)
    from importlib import metadata

    assert any(f"torch {metadata.version('torch')} and the other supported torch versions" in p for p in problems)
    assert "not a valid DCP metadata file" in lc.inspect_checkpoint(root)["problems"][0]
    from ckpt_toy import make_model

    with pytest.raises(lc.CheckpointError, match="not a valid DCP metadata file"):
        lc.load_model_and_optimizer(root, make_model(0))
    with pytest.raises(lc.CheckpointError, match="not a valid DCP metadata file"):
        lc.convert_checkpoint(root)
    assert not marker.exists()


def test_cli_verify_exit_codes(ckpt_runs: Path, copy_step, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    from lr_checkpoint.cli import main

    assert main(["verify", str(ckpt_runs / "fsdp_dcp" / "checkpoints" / "last")]) == 0
    assert capsys.readouterr().out.startswith("OK ")
    root = copy_step("fsdp_safetensors_dcp")
    truncate(root / "training_state" / "rng_state.safetensors", 10)
    assert main(["verify", f"--checkpoint_dir={root}"]) == 1
    out = capsys.readouterr().out
    assert "PROBLEM: " in out and "rng_state.safetensors: truncated" in out


def test_cli_inspect_json_needs_no_torch(ckpt_runs: Path) -> None:
    from _support.procs import subprocess_env

    code = (
        "import sys; from lr_checkpoint.cli import main; code = main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules, 'inspect imported torch'; sys.exit(code)"
    )
    args = [sys.executable, "-c", code, "inspect", str(ckpt_runs / "fsdp_dcp" / "checkpoints"), "--json"]
    done = subprocess.run(args, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["format"] == "dcp" and report["model"][0]["kind"] == "dcp"


def test_resume_checks_the_files_it_reads_and_leaves_the_others_to_verify(copy_step) -> None:  # type: ignore[no-untyped-def]
    """safetensors_dcp resumes from the DCP shards: a flipped byte in its gathered
    model.safetensors does not stop it (verify names the file); a weights-only load does not
    check the optimizer's files; a flipped byte in a shard it reads still stops it."""
    from ckpt_toy import make_model, make_optimizer

    root = copy_step("fsdp_safetensors_dcp")

    def flip(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))

    weights = root / "pretrained_model" / "model.safetensors"
    flip(weights)
    model = make_model(0)
    lc.load_model_and_optimizer(root, model, make_optimizer(model))
    assert [p.split(":")[0] for p in lc.verify_checkpoint(root)] == [str(weights)]

    optimizer_shard = next((root / "training_state" / "optimizer_0").glob("*.distcp"))
    flip(optimizer_shard)
    lc.load_model_and_optimizer(root, make_model(0))  # no optimizer: its files are not read
    model = make_model(0)
    with pytest.raises(lc.CheckpointError, match=re.escape(f"{optimizer_shard}: its bytes differ from the save")):
        lc.load_model_and_optimizer(root, model, make_optimizer(model))
