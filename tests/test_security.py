"""Security: no unpickling of user files, no token on disk, no writes outside the run, no shell.

- Nothing unpickles a user-supplied file except DCP's own metadata, and a `.metadata` that
  is not DCP metadata (a pickle that would run code) is refused by every reader before
  anything unpickles it: the payload never runs (a control run proves it is live).
- A planted HF_TOKEN, used to train, publish at the end of training and publish again
  with `lr-publish` against the loopback Hub, appears in no file, log or upload.
- A crafted checkpoint cannot make lr read or write outside its folder: DCP storage
  entries that point outside, files linked to outside the checkpoint, an output_dir
  elsewhere in its train_config.json.
- The TUI builds argv lists, never shell strings: shell metacharacters in every text
  field travel literally, the rendered command re-splits in bash to the same argv, and
  the launcher starts it without a shell.
"""

from __future__ import annotations

import os
import pickle
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from _support.procs import run_cli
from _support.runs import PLANTED_TOKEN, TinyRun, copy_run, tree_digest

ROOT = Path(__file__).parent.parent
SOURCES = sorted([*ROOT.glob("packages/*/src/**/*.py"), *ROOT.glob("apps/*/src/**/*.py")])
METACHARACTERS = "; rm -rf / $(touch pwned) | && \\ `touch pwned2` > out.txt 'q' \"qq\" *"


def _offending_lines(pattern: str, allowed: set[str] = set()) -> list[str]:
    found = []
    for path in SOURCES:
        rel = path.relative_to(ROOT).as_posix()
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(pattern, line) and rel not in allowed:
                found.append(f"{rel}:{number}: {line.strip()}")
    return found


def test_only_the_restricted_parser_unpickles_and_nothing_runs_a_shell() -> None:
    """No package or app source unpickles (pickle/torch.load/weights_only=False/marshal) except the
    two restricted parsers (DCP metadata; the tensor header of a DCP item, which accepts only the
    tensor-rebuild call: see `packages/lr-checkpoint/tests/test_st_io.py`) and torchvision's ImageNet
    weights file, read only through torch's own restricted unpickler (`torch.load(weights_only=True)`:
    tensors and plain containers), and none starts a shell.
    """
    assert SOURCES
    unpickling = r"\bpickle\.loads?\(|\btorch\.load\(|\bUnpickler\b|weights_only\s*=\s*False|allow_pickle\s*=\s*True|\bmarshal\.loads?\("
    restricted = {"packages/lr-checkpoint/src/lr_checkpoint/_formats/dcp/metadata.py", "packages/lr-checkpoint/src/lr_checkpoint/_formats/torch_save.py"}
    weights_only = "packages/lr-engine/src/lr_engine/_policies/backbone_weights.py:"
    assert [line for line in _offending_lines(unpickling, allowed=restricted)
            if not (line.startswith(weights_only) and "torch.load(" in line and "weights_only=True" in line)] == []
    assert _offending_lines(r"shell\s*=\s*True|\bos\.system\(|\bos\.popen\(|create_subprocess_shell") == []


class _Payload:
    """Unpickled by the real pickle module, it creates `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def _load_metadata(path: Path) -> Any:
    # Our own DCP metadata, written by the session's dcp_run: the one trusted unpickle.
    with path.open("rb") as f:
        return pickle.load(f)


def _write_metadata(path: Path, metadata: Any) -> None:
    path.write_bytes(pickle.dumps(metadata))


@pytest.fixture
def hostile_dcp(dcp_run: TinyRun, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of dcp_run whose two `.metadata` files are genuine DCP metadata with a payload inside."""
    import torch.distributed.checkpoint  # noqa: F401  (the classes the genuine metadata names)

    run = copy_run(dcp_run, tmp_path / "dcp")
    marker = tmp_path / "payload-ran"
    step = run / "checkpoints" / "000004"
    for folder in (step / "pretrained_model" / "pytorch_model_fsdp_0", step / "training_state" / "optimizer_0"):
        metadata = _load_metadata(folder / ".metadata")
        metadata.planner_data = {"hook": _Payload(marker)}
        _write_metadata(folder / ".metadata", metadata)
    return run, marker


def test_a_pickle_that_runs_code_is_refused_by_every_reader(hostile_dcp: tuple[Path, Path]) -> None:
    """Genuine DCP metadata carrying an os.system payload: verify, inspect, convert and resume all
    refuse it naming the file, the payload never runs (a plain pickle.load does run it), nothing
    written.
    """
    run, marker = hostile_dcp
    step = run / "checkpoints" / "000004"
    model_meta = step / "pretrained_model" / "pytorch_model_fsdp_0" / ".metadata"
    before = tree_digest(run)
    commands = {
        "verify": (["lr_checkpoint.cli", "verify", str(step)], 1),
        "inspect": (["lr_checkpoint.cli", "inspect", str(step)], 1),
        "convert": (["lr_checkpoint.cli", "convert", f"--checkpoint_dir={step}"], 2),
        "resume": (["lr_engine.cli", "train", "--resume=true", f"--config_path={step}", f"--output_dir={run}",
                    "--steps=6", "--checkpoint_format=safetensors", "--parallelism.dp_shard=-1"], 2),
    }
    for name, (argv, code) in commands.items():
        proc = run_cli(argv)
        output = proc.stdout + proc.stderr
        assert proc.returncode == code, f"{name}: {output[-3000:]}"
        assert f"{model_meta}: not a valid DCP metadata file" in output, f"{name}: {output[-3000:]}"
        assert "Traceback" not in output, f"{name}: {output[-3000:]}"
        assert not marker.exists(), f"{name} ran the payload"
    assert tree_digest(run) == before

    # Control: the file is a live payload for anything that trusts it.
    subprocess.run([sys.executable, "-c", f"import pickle; pickle.load(open({str(model_meta)!r}, 'rb'))"],
                   capture_output=True, timeout=120)
    assert marker.exists()


def _texts_under(*roots: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for root in roots for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


def test_a_planted_token_is_written_nowhere(tmp_path: Path, demo_dataset: Path, hub_server, tiny_run: TinyRun,
                                            dcp_run: TinyRun) -> None:
    """HF_TOKEN planted for training, publish-at-end, lr-publish and the session's runs: the token is
    in no written file, upload, request body or log (and the Hub required it).
    """
    from _support.runs import TINY

    hub_server.require_token(PLANTED_TOKEN)  # every request must carry it: the token is really in use
    run = tmp_path / "run"
    env = {"HF_TOKEN": PLANTED_TOKEN, "LR_CACHE_DIR": str(tmp_path / "cache"), "HF_HOME": str(tmp_path / "hf_home")}
    trained = run_cli(["lr_engine.cli", "train", f"--output_dir={run}", f"--dataset.root={demo_dataset}", *TINY,
                       "--steps=2", "--save_freq=2", "--policy.push_to_hub=true", "--policy.repo_id=lr-test/at-end",
                       f"--hub.endpoint={hub_server.endpoint}"], env=env, cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    published = run_cli(["lr_publish.cli", f"--checkpoint_dir={run / 'checkpoints' / 'last'}", "--repo_id=lr-test/later",
                         f"--endpoint={hub_server.endpoint}"], env=env, cwd=tmp_path)
    assert published.returncode == 0, published.stderr[-3000:]
    assert set(hub_server.repos) == {"lr-test/at-end", "lr-test/later"}

    secret = PLANTED_TOKEN.encode()
    logs = [trained, published, tiny_run.proc, dcp_run.proc]
    written = _texts_under(tmp_path, tiny_run.path, dcp_run.path)
    uploaded = {f"{repo}:{path}": data for repo in hub_server.repos for path, data in hub_server.files(repo).items()}
    bodies = {f"{r.method} {r.path}": r.body for r in hub_server.requests}
    assert len(written) > 50 and len(uploaded) >= 10
    assert [p for p, data in {**written, **uploaded, **bodies}.items() if secret in data] == []
    assert [p.args for p in logs if PLANTED_TOKEN in p.stdout + p.stderr] == []


def _replace_storage(folder: Path, relative_path: str) -> None:
    import dataclasses

    import torch.distributed.checkpoint  # noqa: F401

    metadata = _load_metadata(folder / ".metadata")
    index, info = next(iter(metadata.storage_data.items()))
    metadata.storage_data[index] = dataclasses.replace(info, relative_path=relative_path)
    _write_metadata(folder / ".metadata", metadata)


def test_dcp_storage_pointing_outside_its_folder_is_refused(dcp_run: TinyRun, tmp_path: Path) -> None:
    """DCP metadata whose storage entry points to ../../../../outside.distcp: verify and convert refuse
    it naming the entry; nothing written.
    """
    run = copy_run(dcp_run, tmp_path / "dcp")
    model_dcp = run / "checkpoints" / "000004" / "pretrained_model" / "pytorch_model_fsdp_0"
    (tmp_path / "outside.distcp").write_bytes((model_dcp / "__0_0.distcp").read_bytes())
    _replace_storage(model_dcp, "../../../../outside.distcp")
    before = tree_digest(tmp_path)
    for argv, code in ((["verify", str(model_dcp.parent.parent)], 1),
                       (["convert", f"--checkpoint_dir={model_dcp.parent.parent}"], 2)):
        proc = run_cli(["lr_checkpoint.cli", *argv])
        assert proc.returncode == code, proc.stderr[-3000:]
        assert "storage entry points outside its folder ('../../../../outside.distcp')" in proc.stdout + proc.stderr
    assert tree_digest(tmp_path) == before


def test_publish_does_not_follow_links_out_of_the_checkpoint(tiny_run: TinyRun, tmp_path: Path) -> None:
    """A checkpoint file that is a link to a file outside it: lr-publish exits 2 naming it and copies
    nothing of the outside file.
    """
    run = copy_run(tiny_run, tmp_path / "run")
    secret_file = tmp_path / "credentials"
    secret_file.write_text("aws_secret_access_key = do-not-upload\n")
    processor = run / "checkpoints" / "000004" / "pretrained_model" / "policy_preprocessor.json"
    processor.unlink()
    processor.symlink_to(secret_file)
    folder = tmp_path / "publish"
    proc = run_cli(["lr_publish.cli", f"--checkpoint_dir={run / 'checkpoints' / 'last'}", "--repo_id=lr-test/links",
                    f"--folder={folder}", "--endpoint=http://127.0.0.1:9"], env={"HF_TOKEN": PLANTED_TOKEN})
    copied = _texts_under(folder) if folder.exists() else {}
    assert [p for p, data in copied.items() if b"do-not-upload" in data] == []
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert str(processor) in proc.stderr


def test_resume_writes_only_inside_the_run_that_holds_the_checkpoint(tiny_run: TinyRun, tmp_path: Path) -> None:
    """A checkpoint whose train_config.json sets output_dir outside its run: resume writes nothing there."""
    import json

    run = copy_run(tiny_run, tmp_path / "run")
    config = run / "checkpoints" / "000004" / "pretrained_model" / "train_config.json"
    data = json.loads(config.read_text())
    data["output_dir"] = str(run / ".." / "elsewhere")
    config.write_text(json.dumps(data))
    proc = run_cli(["lr_engine.cli", "train", "--resume=true", f"--config_path={run / 'checkpoints' / 'last'}", "--steps=5"])
    assert proc.returncode in (0, 2), proc.stderr[-3000:]
    assert not (tmp_path / "elsewhere").exists()


def _launch_values(cwd: Path) -> dict[str, str]:
    """Metacharacters in every text field. The parser reads --policy.path's config.json, so
    that path (relative to `cwd`, the working folder of the test) is a real saved policy."""
    from lr_config import ACTConfig, policy_config_dict, save_json
    from lr_tui._launch_form import default_values

    save_json(cwd / f"x{METACHARACTERS}" / "config.json", policy_config_dict(ACTConfig()))
    values = default_values()
    for key in ("policy_path", "dataset_repo_id", "dataset_root", "output_dir"):
        values[key] = f"x{METACHARACTERS}"
    values["extra"] = shlex.join([f"--job_name=j{METACHARACTERS}", f"--trackio.project=p{METACHARACTERS}"])
    values["launcher"] = "torchrun"
    values["nproc_per_node"] = "2"
    return values


def _bash_split(rendered: str, cwd: Path) -> list[str]:
    """The argv bash parses from `rendered` (its first word replaced by a printer)."""
    command = "printf '%s\\0'" + rendered[rendered.index(" "):]
    done = subprocess.run(["bash", "-c", command], capture_output=True, cwd=cwd, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.decode().split("\0")[:-1]


def test_the_launch_form_passes_shell_metacharacters_literally(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shell metacharacters in every text field of the launch form: each argv element carries them
    literally, bash re-splits the rendered command to the same argv, and the TUI's launcher runs
    it without a shell (no file appears).
    """
    from lr_tui._cli_tasks import start_training
    from lr_tui._launch_form import evaluate

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    plan = evaluate(_launch_values(cwd))
    assert plan.ok and plan.argv is not None, plan.problems
    argv = plan.argv
    for flag in ("--policy.path", "--dataset.repo_id", "--dataset.root", "--output_dir"):
        assert f"{flag}=x{METACHARACTERS}" in argv
    assert f"--job_name=j{METACHARACTERS}" in argv and f"--trackio.project=p{METACHARACTERS}" in argv
    assert _bash_split(plan.preview, tmp_path) == argv[1:]

    printer = [sys.executable, "-c", "import sys; print(sys.argv[1:])", *argv]
    proc = start_training(printer, tmp_path / "out")
    assert proc.wait(timeout=60) == 0
    assert repr(argv) in (tmp_path / "out" / "logs" / "launch.log").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cwd", "out"]  # no pwned, pwned2 or out.txt
    assert [p.name for p in cwd.iterdir()] == ["x; rm -rf "]  # only the saved policy's folder


def test_metacharacters_in_any_other_launch_field_are_refused_at_that_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shell metacharacters in each numeric, launcher or free-flags field: no command is built, and the
    problem is shown at that field.
    """
    from lr_tui._launch_form import FIELDS, evaluate

    monkeypatch.chdir(tmp_path)

    literal = {"policy_path", "dataset_repo_id", "dataset_root", "output_dir"}
    refused = [f.key for f in FIELDS if not f.options and f.key not in literal]
    assert len(refused) >= 10
    for key in refused:
        values = {**_launch_values(tmp_path), "nnodes": "2" if key == "rdzv_endpoint" else "1"}
        plan = evaluate({**values, key: METACHARACTERS})
        assert plan.argv is None and plan.preview == "", key
        assert key in plan.problems, (key, plan.problems)
