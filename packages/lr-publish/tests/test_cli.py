"""`lr-publish` as users run it: exit codes, messages, the printed retry command."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from _support.procs import subprocess_env
from lr_publish import check_publish_folder
from lr_publish.cli import main


def _retry_argv(stderr: str) -> list[str]:
    """The argv of the `lr-publish ...` command printed after 'Retry the push with:'."""
    line = stderr.split("Retry the push with:\n", 1)[1].splitlines()[0].strip()
    argv = shlex.split(line)
    assert argv[0] == "lr-publish"
    return argv[1:]


def _files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_rejected_token_exits_2_keeps_the_folder_and_the_printed_retry_works(hub_server, hub_env, ckpts, cli, tmp_path):
    step_dir = ckpts.make("full")
    hub_server.require_token("hf_someone_else")
    run = cli(["lr_publish.cli", f"--checkpoint_dir={step_dir}", f"--repo_id={ckpts.repo_id}",
               f"--endpoint={hub_server.endpoint}"])

    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    assert "refused the token" in run.stderr and "hf auth login" in run.stderr
    folder = step_dir.parent.parent / "publish" / "act_policy-000120"
    check_publish_folder(folder)
    argv = _retry_argv(run.stderr)
    assert argv == [f"--folder={folder}", f"--repo_id={ckpts.repo_id}", f"--endpoint={hub_server.endpoint}"]

    hub_server.require_token(ckpts.secret)
    retry = cli(["lr_publish.cli", *argv])
    assert retry.returncode == 0, retry.stderr
    assert f"Model pushed to {hub_server.endpoint}/{ckpts.repo_id}" in retry.stdout
    assert hub_server.files(ckpts.repo_id) == _files_under(folder)
    for text in (run.stdout, run.stderr, retry.stdout, retry.stderr):
        assert ckpts.secret not in text
    for path, data in _files_under(tmp_path).items():
        assert ckpts.secret.encode() not in data, path


def test_hub_outage_mid_push_then_the_retry_command_lands_it(hub_server, hub_env, ckpts, cli):
    step_dir = ckpts.make("full")
    hub_server.outage_on("/commit/")  # weights already uploaded, the commit never answered, then down
    run = cli(["lr_publish.cli", f"--checkpoint_dir={step_dir}", f"--repo_id={ckpts.repo_id}",
               f"--endpoint={hub_server.endpoint}", "--private=true"])

    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    assert "failed 3 times" in run.stderr
    assert not hub_server.running
    argv = _retry_argv(run.stderr)
    assert "--private=true" in argv

    hub_server.start()
    retry = cli(["lr_publish.cli", *argv])
    assert retry.returncode == 0, retry.stderr
    folder = Path(argv[0].removeprefix("--folder="))
    assert hub_server.files(ckpts.repo_id) == _files_under(folder)
    assert hub_server.repos[ckpts.repo_id].private


def test_no_token_is_refused_before_any_request(hub_server, ckpts, cli, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_hf_home"))
    step_dir = ckpts.make("full")
    run = cli(["lr_publish.cli", f"--checkpoint_dir={step_dir}", f"--repo_id={ckpts.repo_id}",
               f"--endpoint={hub_server.endpoint}"])
    assert run.returncode == 2
    assert "no Hugging Face token found" in run.stderr and "Traceback" not in run.stderr
    assert hub_server.requests == []
    assert not (step_dir.parent.parent / "publish").exists()


def test_endpoint_from_hf_endpoint(hub_server, hub_env, ckpts, monkeypatch, capsys):
    monkeypatch.setenv("HF_ENDPOINT", hub_server.endpoint)
    step_dir = ckpts.make("full")
    assert main([f"--checkpoint_dir={step_dir}", f"--repo_id={ckpts.repo_id}"]) == 0
    assert f"Model pushed to {hub_server.endpoint}/{ckpts.repo_id}" in capsys.readouterr().out
    assert "model.safetensors" in hub_server.files(ckpts.repo_id)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--repo=lr-test/x", "--checkpoint_dir=."], "--repo: unknown flag (did you mean '--repo_id'?)"),
        (["--checkpoint_dir=."], "--repo_id: required"),
        (["--repo_id=lr-test/x"], "give --checkpoint_dir=DIR"),
        (["--repo_id=lr-test/x", "--folder=.", "--private=yes"], "--private: expected true or false"),
        (["--repo_id=lr-test/x", "--folder="], "--folder: empty value"),
        (["--repo_id=user/na me", "--folder=."], "'user/na me' is not a valid Hub repo id"),
        (["--repo_id=no_namespace", "--folder=."], "'no_namespace' is not a valid Hub repo id"),
        (["checkpoint"], "expected --name=value"),
    ],
)
def test_bad_flags_exit_2_before_any_request(hub_server, hub_env, argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert hub_server.requests == []


def test_missing_checkpoint_exits_2(hub_server, hub_env, tmp_path, capsys):
    assert main([f"--checkpoint_dir={tmp_path / 'nope'}", "--repo_id=lr-test/x", f"--endpoint={hub_server.endpoint}"]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert hub_server.requests == []


def test_help_lists_every_flag(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--checkpoint_dir", "--repo_id", "--private", "--revision", "--endpoint", "--folder"):
        assert flag in out



def test_the_cli_publishes_without_importing_torch(hub_server, hub_env, ckpts):
    step_dir = ckpts.make("full")
    argv = [f"--checkpoint_dir={step_dir}", f"--repo_id={ckpts.repo_id}", f"--endpoint={hub_server.endpoint}"]
    code = (f"import sys; from lr_publish.cli import main; rc = main({argv!r}); "
            "print('torch imported' if 'torch' in sys.modules else 'no torch'); sys.exit(rc)")
    run = subprocess.run([sys.executable, "-c", code], env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "no torch" in run.stdout
    assert "model.safetensors" in hub_server.files(ckpts.repo_id)


def test_private_push_to_an_existing_public_repo_exits_2_and_uploads_nothing(hub_server, hub_env, ckpts, cli):
    from huggingface_hub import HfApi

    HfApi(endpoint=hub_server.endpoint, token=ckpts.secret).create_repo(ckpts.repo_id)  # public, as the Hub's default
    step_dir = ckpts.make("full")
    run = cli(["lr_publish.cli", f"--checkpoint_dir={step_dir}", f"--repo_id={ckpts.repo_id}",
               f"--endpoint={hub_server.endpoint}", "--private=true"])
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    assert f"{ckpts.repo_id} is public on {hub_server.endpoint}" in run.stderr and "uploaded nothing" in run.stderr
    assert "--private=true" in _retry_argv(run.stderr)
    assert hub_server.files(ckpts.repo_id) == {} and not hub_server.repos[ckpts.repo_id].private


def _publish_env(ckpts) -> dict[str, str]:
    return subprocess_env({"HF_TOKEN": ckpts.secret})


def test_a_publish_folder_that_cannot_be_made_exits_2_naming_it_and_the_flag(hub_server, hub_env, ckpts, cli, tmp_path):
    """--folder under a file (ENOTDIR; a permission error or a read-only disk alike, and it stops root too)."""
    step_dir = ckpts.make("full")
    (tmp_path / "a_file").write_text("not a folder")
    folder = tmp_path / "a_file" / "out"
    run = cli(["lr_publish.cli", f"--checkpoint_dir={step_dir}", f"--repo_id={ckpts.repo_id}",
               f"--endpoint={hub_server.endpoint}", f"--folder={folder}"])
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    assert f"cannot write the publish folder {folder} (File exists: {tmp_path / 'a_file'})" in run.stderr
    assert "--folder=DIR" in run.stderr
    assert hub_server.requests == []


def test_a_full_disk_while_writing_the_publish_folder_exits_2_and_leaves_nothing(hub_server, hub_env, ckpts, tmp_path):
    """RLIMIT_FSIZE (a full disk alike, and it stops root too) below the weights' size: exit 2 naming the
    folder and --folder, no traceback, no publish folder and no temporary folder left, nothing sent."""
    import resource

    step_dir = ckpts.make("full")
    before = _files_under(tmp_path)
    limit = (step_dir / "pretrained_model" / "model.safetensors").stat().st_size // 2

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    run = subprocess.run([sys.executable, "-m", "lr_publish.cli", f"--checkpoint_dir={step_dir}",
                          f"--repo_id={ckpts.repo_id}", f"--endpoint={hub_server.endpoint}"],
                         env=_publish_env(ckpts), capture_output=True, text=True, timeout=120, preexec_fn=small_files)
    folder = step_dir.parent.parent / "publish" / "act_policy-000120"
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    assert f"cannot write the publish folder {folder} (File too large" in run.stderr and "--folder=DIR" in run.stderr
    assert _files_under(tmp_path) == before
    assert not (step_dir.parent.parent / "publish").exists()
    assert hub_server.requests == []
