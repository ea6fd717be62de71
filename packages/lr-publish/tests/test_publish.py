"""Publishing checkpoints and folders with the real HfApi against the loopback Hub."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from huggingface_hub import ModelCard
from lr_config import ConfigError, banner_line, load_train_config
from lr_publish import (
    HubPushError,
    HubUnavailableError,
    PublishError,
    build_publish_folder_from_checkpoint,
    check_publish_folder,
    publish_checkpoint,
    publish_folder,
)

PUBLISHED = {
    "README.md", "config.json", "train_config.json", "model.safetensors", "policy_preprocessor.json",
    "policy_postprocessor.json", "policy_preprocessor_step_0_normalizer.safetensors",
}


def _local_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _publish_dir(step_dir: Path, ckpts) -> Path:
    return step_dir.parent.parent / "publish" / f"act_policy-{ckpts.step:06d}"


def test_checkpoint_lands_byte_identical_and_nothing_private_is_sent(hub_server, hub_env, ckpts):
    hub_server.require_token(ckpts.secret)  # every request must carry the token, or it is a 401
    step_dir = ckpts.make("full")

    url = publish_checkpoint(step_dir.parent / "last", ckpts.repo_id, endpoint=hub_server.endpoint)

    folder = _publish_dir(step_dir, ckpts)
    assert url == f"{hub_server.endpoint}/{ckpts.repo_id}"
    assert set(_local_files(folder)) == PUBLISHED
    assert hub_server.files(ckpts.repo_id) == _local_files(folder)
    sent = " ".join(hub_server.paths_requested() + hub_server.committed_paths(ckpts.repo_id))
    for private in ("fsdp", "distcp", ".metadata", "training_state", "optimizer", "training_step"):
        assert private not in sent
    assert all(ckpts.secret.encode() not in r.body for r in hub_server.requests)
    assert all(ckpts.secret not in json.dumps(r.headers) for r in hub_server.requests)
    assert hub_server.unhandled == []
    assert not hub_server.repos[ckpts.repo_id].private


def test_weights_go_through_the_lfs_batch_api_and_json_inline(hub_server, hub_env, ckpts):
    step_dir = ckpts.make("full")
    publish_checkpoint(step_dir, ckpts.repo_id, endpoint=hub_server.endpoint)

    paths = hub_server.paths_requested()
    assert f"/{ckpts.repo_id}.git/info/lfs/objects/batch" in paths
    assert f"/{ckpts.repo_id}.git/info/lfs/objects/verify" in paths
    puts = [r for r in hub_server.requests if r.method == "PUT"]
    model = (_publish_dir(step_dir, ckpts) / "model.safetensors").read_bytes()
    assert any(r.body == model for r in puts)
    assert hub_server.lfs_paths(ckpts.repo_id) == {"model.safetensors", "policy_preprocessor_step_0_normalizer.safetensors"}


def test_large_file_goes_through_lfs_by_size(hub_server, hub_env, ckpts, tmp_path):
    step_dir = ckpts.make("full")
    folder = tmp_path / "out"
    build_publish_folder_from_checkpoint(step_dir, folder, repo_id=ckpts.repo_id)
    hub_server.lfs_threshold = (folder / "train_config.json").stat().st_size  # the Hub's size rule, scaled down

    publish_folder(folder, ckpts.repo_id, endpoint=hub_server.endpoint)

    assert "train_config.json" in hub_server.lfs_paths(ckpts.repo_id)
    assert "config.json" not in hub_server.lfs_paths(ckpts.repo_id)
    assert hub_server.files(ckpts.repo_id) == _local_files(folder)


def test_model_card_metadata_and_body(hub_server, hub_env, ckpts):
    step_dir = ckpts.make("full")
    publish_checkpoint(step_dir, ckpts.repo_id, endpoint=hub_server.endpoint)

    card = ModelCard(hub_server.files(ckpts.repo_id)["README.md"].decode())
    meta = card.data.to_dict()
    assert meta["license"] == "mit"
    assert meta["library_name"] == "lr"
    assert meta["pipeline_tag"] == "robotics"
    assert meta["tags"] == ["act", "lr", "robotics"]
    assert meta["datasets"] == ["lr-test/reach_dataset"]
    assert "base_model" not in meta
    cfg = load_train_config(step_dir / "pretrained_model" / "train_config.json")
    body = card.text
    assert banner_line(cfg, ckpts.topology) in body
    assert "batch_size 8 x dp_world_size 4 x grad_accum 1 = effective batch 32" in body
    assert "HSDP dp_replicate=2 dp_shard=2 world=4" in body
    assert "| precision | bf16 mixed precision |" in body
    assert f"{ckpts.step} loop steps" in body
    assert "7 episodes, 420 frames at 15 fps" in body
    assert "`observation.images.top` | image | [32, 32, 3]" in body
    assert "`episode_index`" not in body
    assert f'snapshot_download("{ckpts.repo_id}")' in body


def test_adapter_checkpoint_publishes_adapter_with_base_model(hub_server, hub_env, ckpts):
    step_dir = ckpts.make("adapter")
    publish_checkpoint(step_dir, ckpts.repo_id, endpoint=hub_server.endpoint)

    files = hub_server.files(ckpts.repo_id)
    assert {"adapter_model.safetensors", "adapter_config.json"} <= set(files)
    assert "model.safetensors" not in files
    meta = ModelCard(files["README.md"].decode()).data.to_dict()
    assert meta["base_model"] == "lr-test/base_policy"
    assert "adapter_model.safetensors" in files["README.md"].decode()
    assert "LoRA adapter weights (rank 4) on top of the base policy `lr-test/base_policy`" in files["README.md"].decode()


def test_dcp_only_checkpoint_is_refused_before_anything(hub_server, hub_env, ckpts):
    step_dir = ckpts.make("dcp")
    with pytest.raises(PublishError, match=r"lr-checkpoint convert \S+000120"):
        publish_checkpoint(step_dir, ckpts.repo_id, endpoint=hub_server.endpoint)
    assert hub_server.requests == []
    assert not (step_dir.parent.parent / "publish").exists()


def test_a_file_missing_from_the_checkpoint_is_named_where_it_was_not_the_staging_folder(hub_server, hub_env, ckpts):
    """The check runs on a temporary folder that is gone when the message is read."""
    step_dir = ckpts.make()
    (step_dir / "pretrained_model" / "config.json").unlink()
    with pytest.raises(PublishError) as err:
        publish_checkpoint(step_dir, ckpts.repo_id, endpoint=hub_server.endpoint)
    assert str(err.value) == f"{step_dir / 'pretrained_model' / 'config.json'} is missing; every publish folder needs it"
    assert hub_server.requests == []
    assert not (step_dir.parent.parent / "publish").exists()


def test_server_errors_are_retried_until_the_push_lands(hub_server, hub_env, ckpts):
    step_dir = ckpts.make("full")
    hub_server.fail_next(1, 500)
    hub_server.fail_next(1, 429)

    publish_checkpoint(step_dir, ckpts.repo_id, endpoint=hub_server.endpoint)

    statuses = [(r.path, r.status) for r in hub_server.requests[:3]]
    assert statuses == [("/api/repos/create", 500), ("/api/repos/create", 429), ("/api/repos/create", 200)]
    assert hub_server.files(ckpts.repo_id) == _local_files(_publish_dir(step_dir, ckpts))


def test_persistent_server_errors_give_up_with_a_retry_command(hub_server, hub_env, ckpts):
    step_dir = ckpts.make("full")
    hub_server.fail_next(3, 503)
    with pytest.raises(HubUnavailableError) as info:
        publish_checkpoint(step_dir, ckpts.repo_id, endpoint=hub_server.endpoint)
    folder = _publish_dir(step_dir, ckpts)
    assert info.value.exit_code == 1
    assert info.value.retry_command == (f"lr-publish --folder={folder} --repo_id={ckpts.repo_id} "
                                        f"--endpoint={hub_server.endpoint}")
    assert "failed 3 times" in str(info.value)
    check_publish_folder(folder)  # intact and still publishable


@pytest.mark.parametrize(("status", "advice"), [(401, "hf auth login"), (403, "write access"), (404, "check --repo_id")])
def test_permanent_refusals_are_not_retried(hub_server, hub_env, ckpts, status, advice):
    step_dir = ckpts.make("full")
    hub_server.fail_next(10, status)
    with pytest.raises(HubPushError) as info:
        publish_checkpoint(step_dir, ckpts.repo_id, endpoint=hub_server.endpoint)
    assert not isinstance(info.value, HubUnavailableError)
    assert info.value.exit_code == 2 and info.value.status == status
    assert advice in str(info.value)
    assert len([r for r in hub_server.requests if r.path == "/api/repos/create"]) == 1


def test_revision_branch_and_private_repo(hub_server, hub_env, ckpts):
    step_dir = ckpts.make("full")
    url = publish_checkpoint(step_dir, ckpts.repo_id, endpoint=hub_server.endpoint, revision="v1", private=True)

    assert url == f"{hub_server.endpoint}/{ckpts.repo_id}/tree/v1"
    assert hub_server.repos[ckpts.repo_id].private
    assert hub_server.files(ckpts.repo_id, "v1") == _local_files(_publish_dir(step_dir, ckpts))
    assert hub_server.files(ckpts.repo_id, "main") == {}


def test_pushing_the_same_folder_twice_is_a_no_op(hub_server, hub_env, ckpts):
    step_dir = ckpts.make("full")
    publish_checkpoint(step_dir, ckpts.repo_id, endpoint=hub_server.endpoint)
    publish_folder(_publish_dir(step_dir, ckpts), ckpts.repo_id, endpoint=hub_server.endpoint)
    assert len(hub_server.repos[ckpts.repo_id].commits) == 1


def test_existing_publish_folder_is_never_overwritten(hub_server, hub_env, ckpts, tmp_path):
    step_dir = ckpts.make("full")
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    with pytest.raises(PublishError, match=r"already exists.*--folder="):
        publish_checkpoint(step_dir, ckpts.repo_id, endpoint=hub_server.endpoint, folder=folder)
    assert (folder / "notes.txt").read_text() == "keep me"
    assert hub_server.requests == []


def test_a_token_planted_in_a_file_stops_the_publish(hub_server, hub_env, ckpts, tmp_path):
    step_dir = ckpts.make("full")
    folder = tmp_path / "out"
    build_publish_folder_from_checkpoint(step_dir, folder, repo_id=ckpts.repo_id)
    (folder / "config.json").write_text(json.dumps({"type": "act", "note": ckpts.secret}))
    with pytest.raises(PublishError, match="contains your Hugging Face token") as info:
        publish_folder(folder, ckpts.repo_id, endpoint=hub_server.endpoint)
    assert ckpts.secret not in str(info.value)
    assert hub_server.requests == []


def test_private_files_in_a_folder_are_refused(hub_server, hub_env, ckpts, tmp_path):
    step_dir = ckpts.make("full")
    folder = tmp_path / "out"
    build_publish_folder_from_checkpoint(step_dir, folder, repo_id=ckpts.repo_id)
    (folder / "pytorch_model_fsdp_0").mkdir()
    (folder / "pytorch_model_fsdp_0" / "__0_0.distcp").write_bytes(b"shard")
    with pytest.raises(PublishError, match="never uploaded"):
        publish_folder(folder, ckpts.repo_id, endpoint=hub_server.endpoint)
    assert hub_server.requests == []


@pytest.mark.parametrize("repo_id", ["no_namespace", "a/b/c", "user/bad name", "user/..x", "user/x--y", "/lead"])
def test_bad_repo_ids_are_refused_before_anything(hub_server, hub_env, ckpts, repo_id):
    step_dir = ckpts.make("full")
    with pytest.raises(ConfigError, match="not a valid Hub repo id"):
        publish_checkpoint(step_dir, repo_id, endpoint=hub_server.endpoint)
    assert hub_server.requests == []
    assert not (step_dir.parent.parent / "publish").exists()


def test_a_link_in_a_folder_is_refused_not_followed(hub_server, hub_env, ckpts, tmp_path):
    """--folder mode: a file that is a link (here to a file outside the folder) stops the push before any
    request, naming the link; upload_folder would otherwise send what it points to."""
    step_dir = ckpts.make("full")
    folder = tmp_path / "out"
    build_publish_folder_from_checkpoint(step_dir, folder, repo_id=ckpts.repo_id)
    outside = tmp_path / "credentials"
    outside.write_text("aws_secret_access_key = do-not-upload\n")
    (folder / "policy_preprocessor.json").unlink()
    (folder / "policy_preprocessor.json").symlink_to(outside)
    with pytest.raises(PublishError, match=r"policy_preprocessor\.json is a link .*only real files"):
        publish_folder(folder, ckpts.repo_id, endpoint=hub_server.endpoint)
    assert hub_server.requests == []


def _write_checksums(step_dir: Path) -> None:
    """checksums.json as lr-checkpoint's save writes it: size, SHA-256, CRC-32 of every file."""
    import hashlib
    import zlib

    from lr_config import Checksums, FileDigest, save_checksums

    files = {}
    for path in sorted(p for p in step_dir.rglob("*") if p.is_file()):
        data = path.read_bytes()
        files[path.relative_to(step_dir).as_posix()] = FileDigest(
            size=len(data), sha256=hashlib.sha256(data).hexdigest(), crc32=f"{zlib.crc32(data):08x}"
        )
    save_checksums(step_dir / "checksums.json", Checksums(files=files))


def test_a_checkpoint_file_whose_bytes_changed_since_the_save_is_not_published(hub_server, hub_env, ckpts, tmp_path):
    """Resume from DCP shards never reads the gathered model.safetensors, so its checksum is
    checked as publish copies it: a flipped byte is a PublishError naming the file, before
    any network call and with no publish folder left behind."""
    step_dir = ckpts.make("full")
    _write_checksums(step_dir)
    build_publish_folder_from_checkpoint(step_dir, tmp_path / "intact", repo_id=ckpts.repo_id)  # the check passes

    weights = step_dir / "pretrained_model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-2] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(PublishError, match=rf"{weights}: its bytes differ from the save .*checksums\.json"):
        publish_checkpoint(step_dir, ckpts.repo_id, endpoint=hub_server.endpoint)
    assert hub_server.requests == []
    assert not (step_dir.parent.parent / "publish").exists()


def _hub_api(hub_server, ckpts):
    from huggingface_hub import HfApi

    return HfApi(endpoint=hub_server.endpoint, token=ckpts.secret)


def test_private_push_to_an_existing_public_repo_uploads_nothing(hub_server, hub_env, ckpts):
    """private=true never changes an existing repo's visibility (create_repo(exist_ok=True) keeps it), so
    a push meant to be private that finds the repo public is refused before any upload: exit 2, the repo
    as it was, and the message says how to proceed. Made private on the Hub, the printed retry lands it."""
    publish_checkpoint(ckpts.make("full"), ckpts.repo_id, endpoint=hub_server.endpoint)
    before, commits = hub_server.files(ckpts.repo_id), len(hub_server.repos[ckpts.repo_id].commits)
    step_dir = ckpts.make("adapter", run="other")
    sent = len(hub_server.requests)

    with pytest.raises(HubPushError) as info:
        publish_checkpoint(step_dir, ckpts.repo_id, endpoint=hub_server.endpoint, private=True)

    message = str(info.value)
    assert info.value.exit_code == 2 and not isinstance(info.value, HubUnavailableError)
    assert f"{ckpts.repo_id} is public on {hub_server.endpoint}" in message
    assert "never changes an existing repo's visibility" in message and "uploaded nothing" in message
    assert f"`hf repos settings {ckpts.repo_id} --private`" in message and "another repo id" in message
    assert "--private=true" in info.value.retry_command
    later = hub_server.requests[sent:]
    assert not [r.path for r in later if r.method in ("PUT", "DELETE") or "/preupload/" in r.path or "/commit/" in r.path]
    assert hub_server.files(ckpts.repo_id) == before and len(hub_server.repos[ckpts.repo_id].commits) == commits
    assert not hub_server.repos[ckpts.repo_id].private

    _hub_api(hub_server, ckpts).update_repo_settings(ckpts.repo_id, private=True)
    publish_folder(info.value.folder, ckpts.repo_id, endpoint=hub_server.endpoint, private=True)
    assert hub_server.files(ckpts.repo_id) == _local_files(info.value.folder)
    assert hub_server.repos[ckpts.repo_id].private


def test_private_push_to_an_existing_private_repo_and_public_push_keep_the_visibility(hub_server, hub_env, ckpts):
    publish_checkpoint(ckpts.make("full"), ckpts.repo_id, endpoint=hub_server.endpoint, private=True)
    publish_checkpoint(ckpts.make("adapter", run="second"), ckpts.repo_id, endpoint=hub_server.endpoint, private=True)
    publish_checkpoint(ckpts.make("full", run="third"), ckpts.repo_id, endpoint=hub_server.endpoint)
    assert hub_server.repos[ckpts.repo_id].private
    assert len(hub_server.repos[ckpts.repo_id].commits) == 3


@pytest.mark.parametrize(("first", "then", "stale"), [
    ("adapter", "full", {"adapter_model.safetensors", "adapter_config.json"}),
    ("full", "adapter", {"model.safetensors"}),
])
def test_a_push_removes_the_files_an_earlier_push_left_and_keeps_the_users(hub_server, hub_env, ckpts, first, then, stale):
    """Full weights pushed over a LoRA adapter (and the reverse): the other kind's files go in the same
    commit, so the repo matches its new card (and weights_kind). Files lr never writes stay: a user's
    notes, and a root-like name in a subfolder."""
    publish_checkpoint(ckpts.make(first), ckpts.repo_id, endpoint=hub_server.endpoint)
    api = _hub_api(hub_server, ckpts)
    mine = {"notes.md": b"my notes", "eval/model_step_1000.safetensors": b"not lr's", "eval/config.json": b"{}"}
    for path, data in mine.items():
        api.upload_file(path_or_fileobj=data, path_in_repo=path, repo_id=ckpts.repo_id)
    assert stale <= set(hub_server.files(ckpts.repo_id))
    commits = len(hub_server.repos[ckpts.repo_id].commits)

    step_dir = ckpts.make(then, run="second")
    publish_checkpoint(step_dir, ckpts.repo_id, endpoint=hub_server.endpoint)

    folder = step_dir.parent.parent / "publish" / f"act_policy-{ckpts.step:06d}"
    assert hub_server.files(ckpts.repo_id) == {**_local_files(folder), **mine}
    last = hub_server.repos[ckpts.repo_id].commits[-1]
    assert len(hub_server.repos[ckpts.repo_id].commits) == commits + 1
    assert set(last["deleted"]) == stale

    from lr_publish._folder import weights_kind

    copy = folder.parent / "what_the_hub_holds"
    for path, data in hub_server.files(ckpts.repo_id).items():
        (copy / path).parent.mkdir(parents=True, exist_ok=True)
        (copy / path).write_bytes(data)
    assert weights_kind(copy) == ("adapter" if then == "adapter" else "full")


def test_a_push_removes_an_earlier_pushs_processor_files_it_no_longer_has(hub_server, hub_env, ckpts):
    publish_checkpoint(ckpts.make("full"), ckpts.repo_id, endpoint=hub_server.endpoint)
    step_dir = ckpts.make("full", run="second")
    (step_dir / "pretrained_model" / "policy_preprocessor_step_0_normalizer.safetensors").rename(
        step_dir / "pretrained_model" / "policy_preprocessor_step_0_normalizer_processor.safetensors")
    publish_checkpoint(step_dir, ckpts.repo_id, endpoint=hub_server.endpoint)
    files = set(hub_server.files(ckpts.repo_id))
    assert "policy_preprocessor_step_0_normalizer_processor.safetensors" in files
    assert "policy_preprocessor_step_0_normalizer.safetensors" not in files


def test_a_step_folder_outside_a_run_stages_beside_itself(hub_server, hub_env, ckpts, tmp_path):
    """A step folder copied out of its run (/data/000120): the default publish folder is
    /data/publish/<name>-<step>, never <its grandparent>/publish (/publish for /data/000120)."""
    import shutil

    data = tmp_path / "data"
    data.mkdir()
    step_dir = Path(shutil.move(ckpts.make("full"), data / f"{ckpts.step:06d}"))
    publish_checkpoint(step_dir, ckpts.repo_id, endpoint=hub_server.endpoint)
    folder = data / "publish" / f"act_policy-{ckpts.step:06d}"
    assert hub_server.files(ckpts.repo_id) == _local_files(folder)
    assert not (tmp_path / "publish").exists()
