"""The publish folder: what is uploaded, built and checked locally before any network call.

A publish folder holds exactly:

    config.json, train_config.json, README.md (the model card),
    model.safetensors | adapter_model.safetensors + adapter_config.json (LoRA),
    policy_preprocessor.json, policy_postprocessor.json, *_step_*.safetensors

It is built under a hidden temporary name beside its final path, checked, then renamed,
so a crash never leaves half a folder, and an existing folder is never overwritten. A folder
that cannot be written (no permission, a full disk, a file in the way) is a PublishError
naming it and the flag that moves it; the temporary folder is removed.
These names (`is_published_name`) are the files lr owns in a Hub repo: a push deletes those
an earlier push left that the new folder does not have (see `_hub`).
`check_publish_folder` refuses DCP shards, training state, unreadable safetensors, a card
`ModelCard` cannot parse, and any file that contains the Hugging Face token. A copy of a
checkpoint's file is checked against the step folder's checksums.json as it is made.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, get_token
from lr_config import FileDigest, TrainingStep, load_checksums, load_train_config, read_json_object
from lr_config.layout import ADAPTER_CONFIG, ADAPTER_WEIGHTS, MODEL_WEIGHTS, POLICY_CONFIG, PRETRAINED, TRAINING_STATE, TRAIN_CONFIG
from safetensors import safe_open
from zlib_ng.zlib_ng import crc32

from ._card import model_card
from ._errors import PublishError

__all__ = [
    "check_publish_folder",
    "copy_checkpoint_files",
    "default_publish_folder",
    "is_published_name",
    "staged_folder",
    "weights_kind",
    "write_card",
]

CHECKSUMS = "checksums.json"

_PUBLISHED_NAMES = frozenset({
    "config.json", "train_config.json", "model.safetensors", "adapter_model.safetensors",
    "adapter_config.json", "policy_preprocessor.json", "policy_postprocessor.json", "lr_policy.json",
})
_PUBLISHED_PATTERNS = ("*_step_*.safetensors",)
_NEVER_UPLOADED = ("pytorch_model_fsdp_*", "optimizer_*", TRAINING_STATE, "*.distcp", ".metadata")
_SCAN_CHUNK = 1 << 20


def default_publish_folder(output_dir: Path, repo_id: str, step: int) -> Path:
    """`<output_dir>/publish/<repo name>-<step:06d>`: beside the checkpoints, never inside one."""
    return Path(output_dir) / "publish" / f"{repo_id.split('/')[-1]}-{step:06d}"


def is_published_name(name: str) -> bool:
    """A file name a publish folder may hold at its top (README.md aside, which every folder has)."""
    return name in _PUBLISHED_NAMES or any(fnmatch.fnmatch(name, g) for g in _PUBLISHED_PATTERNS)


def weights_kind(model_dir: Path) -> str:
    """'adapter' (LoRA files) or 'full' (model.safetensors); PublishError when neither is there."""
    if (model_dir / ADAPTER_WEIGHTS).is_file() and (model_dir / ADAPTER_CONFIG).is_file():
        return "adapter"
    if (model_dir / MODEL_WEIGHTS).is_file():
        return "full"
    if any(model_dir.glob("pytorch_model_fsdp_*")):
        step_dir = model_dir.parent if model_dir.name == PRETRAINED else model_dir
        raise PublishError(
            f"{model_dir} holds only DCP shards, which are never uploaded: run "
            f"`lr-checkpoint convert {step_dir}` first to write model.safetensors, then publish again"
        )
    raise PublishError(
        f"{model_dir} has no weights to publish: expected model.safetensors, "
        "or adapter_model.safetensors with adapter_config.json"
    )


@contextmanager
def staged_folder(folder: Path, *, token: str | None = None, flag: str = "--folder", source: Path | None = None) -> Iterator[Path]:
    """Yield a fresh temporary folder that becomes `folder` once the block ends and it checks out.

    An OSError writing it (a folder that cannot be created or written, a full disk) is a
    PublishError naming `folder` and `flag`, the setting that chooses another place; one
    reading a source file names that file. A file the check refuses is named where it came
    from (`source`, the folder the files were copied from), never by the temporary name, which
    is gone by the time the message is read. Either way nothing is left behind."""
    folder = Path(folder)
    tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}"
    made: list[Path] = []
    try:
        if folder.exists():
            raise PublishError(
                f"{folder} already exists and is never overwritten: push it as it is with "
                f"`lr-publish --folder={folder} --repo_id=...`, or choose another --folder"
            )
        made = [p for p in (folder.parent, *folder.parent.parents) if not p.exists()]
        folder.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        yield tmp
        try:
            check_publish_folder(tmp, token=token)
        except PublishError as exc:
            shown = str(source) if source is not None else str(folder)
            raise PublishError(str(exc).replace(str(tmp), shown), problems=[p.replace(str(tmp), shown) for p in exc.problems]) from None
        os.rename(tmp, folder)
    except OSError as exc:
        raise _staging_error(exc, folder, tmp, flag) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.lexists(folder):
            for parent in made:  # the folders made for it, innermost first, while empty
                with contextlib.suppress(OSError):  # not empty: another publish may be writing there
                    parent.rmdir()


def _staging_error(exc: OSError, folder: Path, tmp: Path, flag: str) -> PublishError:
    """What failed while building `folder` (as `tmp`), and what to change."""
    reason = exc.strerror or type(exc).__name__
    named = [Path(os.fsdecode(n)) for n in (exc.filename, exc.filename2) if n is not None]  # shutil: (source, copy)
    written = [p for p in named if p in (folder, tmp) or p in folder.parents or tmp in p.parents]
    if named and not written:
        return PublishError(f"cannot read {named[0]} ({reason}) while building the publish folder {folder}: "
                            "make it readable, then publish again; nothing was uploaded")
    where = written[0] if written and written[0] not in (folder, tmp) else None
    if where is not None and tmp in where.parents:
        where = where.relative_to(tmp)  # a file of the folder: its temporary name means nothing to the user
    return PublishError(
        f"cannot write the publish folder {folder} ({reason}{f': {where}' if where is not None else ''}); "
        f"nothing was uploaded and nothing is left there: choose a writable folder with free space with {flag}=DIR, "
        "or make that one writable"
    )


def copy_checkpoint_files(model_dir: Path, dest: Path) -> list[str]:
    """Copy the publishable files of a checkpoint's pretrained_model/ (never its DCP shards).

    A link among them is refused rather than followed: a checkpoint file linked to a file outside
    the checkpoint (say ~/.aws/credentials) would otherwise be copied and uploaded.
    """
    if model_dir.is_symlink():
        raise _link_error(model_dir)
    published = sorted((p for p in model_dir.iterdir() if is_published_name(p.name)), key=lambda p: p.name)
    for path in published:
        if path.is_symlink():
            raise _link_error(path)
    names = [p.name for p in published if p.is_file()]
    expected = _saved_digests(model_dir)
    for name in names:
        shutil.copy2(model_dir / name, dest / name, follow_symlinks=False)
        digest = expected.get(f"{model_dir.name}/{name}")
        if digest is not None and not _same_bytes(dest / name, digest):
            raise PublishError(
                f"{model_dir / name}: its bytes differ from the save (its checksum does not match "
                f"{model_dir.parent / CHECKSUMS}); the file is damaged: publish another checkpoint "
                "(`lr-checkpoint verify` names every damaged file)"
            )
    return names


def _saved_digests(model_dir: Path) -> dict[str, FileDigest]:
    """The step folder's checksums.json entries (relative names), or {} when it has none.

    Resume checks only the files it reads; a checkpoint that resumes from DCP shards never
    reads its gathered model.safetensors, so the copy that is uploaded is checked here."""
    path = model_dir.parent / CHECKSUMS
    return load_checksums(path).files if path.is_file() else {}


def _same_bytes(path: Path, expected: FileDigest) -> bool:
    """The file's size and CRC-32 (its SHA-256 for an entry without one) against `expected`."""
    crc, sha, size = 0, hashlib.sha256() if not expected.crc32 else None, 0
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            crc = crc32(chunk, crc)
            if sha is not None:
                sha.update(chunk)
            size += len(chunk)
    if size != expected.size:
        return False
    return sha.hexdigest() == expected.sha256 if sha is not None else f"{crc:08x}" == expected.crc32


def _link_error(path: Path) -> PublishError:
    return PublishError(
        f"{path} is a link (to {os.readlink(path)}), and lr-publish uploads only real files, never what a link "
        "points to: replace the link with a copy of the file it should be, then publish again"
    )


def write_card(folder: Path, repo_id: str, training_step: TrainingStep) -> None:
    """README.md from the folder's train_config.json (and adapter_config.json for LoRA)."""
    train_config = load_train_config(folder / TRAIN_CONFIG)
    adapter = _read_object(folder / ADAPTER_CONFIG) if (folder / ADAPTER_CONFIG).exists() else None
    text = model_card(repo_id, train_config=train_config, training_step=training_step, adapter_config=adapter)
    (folder / "README.md").write_text(text, encoding="utf-8")


def _read_object(path: Path) -> dict[str, Any]:
    return read_json_object(path, error=PublishError, missing=" is missing; every publish folder needs it")


def check_publish_folder(folder: Path, *, token: str | None = None) -> None:
    """Refuse a folder that must not or cannot be published; the message says what to change."""
    folder = Path(folder)
    if not folder.is_dir():
        raise PublishError(f"--folder={folder}: not a folder")
    _check_nothing_private(folder)
    _read_object(folder / POLICY_CONFIG)
    weights_kind(folder)
    for path in sorted(folder.rglob("*.safetensors")):
        _check_safetensors(path)
    _check_card(folder / "README.md")
    secret = token or get_token()
    if secret:
        _check_no_secret(folder, secret)


def _check_nothing_private(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_symlink():
            raise _link_error(path)
        if any(fnmatch.fnmatch(part, pattern) for part in path.relative_to(folder).parts for pattern in _NEVER_UPLOADED):
            raise PublishError(
                f"{path} is DCP shards or training state, which are never uploaded: remove it from {folder}"
            )


def _check_safetensors(path: Path) -> None:
    try:
        with safe_open(str(path), framework="np") as f:
            f.keys()
    except Exception as exc:  # safetensors raises several types for a bad header
        raise PublishError(f"{path} is not a readable safetensors file ({exc}); rebuild the publish folder") from None


def _check_card(path: Path) -> None:
    if not path.is_file():
        raise PublishError(f"{path} is missing: every publish folder needs a model card")
    try:
        ModelCard(path.read_text(encoding="utf-8"), ignore_metadata_errors=False)
    except Exception as exc:  # yaml and huggingface_hub raise several types for a bad card
        raise PublishError(f"{path}: the model card metadata does not parse ({exc}); fix its YAML header") from None


def _check_no_secret(folder: Path, secret: str) -> None:
    needle = secret.encode()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if _file_contains(path, needle):
            raise PublishError(
                f"{path} contains your Hugging Face token: remove it from the file before publishing "
                "(the token belongs in HF_TOKEN or `hf auth login`, never in a file)"
            )


def _file_contains(path: Path, needle: bytes) -> bool:
    tail = b""
    with open(path, "rb") as f:
        while chunk := f.read(_SCAN_CHUNK):
            if needle in tail + chunk:
                return True
            tail = chunk[-(len(needle) - 1):] if len(needle) > 1 else b""
    return False
