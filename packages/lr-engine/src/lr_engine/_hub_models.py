"""`--policy.path` as a folder or a Hub repo id: where the saved policy's files are.

No torch here: `lr-engine train` resolves a Hub id before it parses its flags (the parser then
reads the downloaded config.json like a local one), and `lr-engine eval` before it loads.
A Hub id is downloaded once through `huggingface_hub` (its cache, HF_ENDPOINT, HF_TOKEN and
HF_HUB_OFFLINE apply; `--policy.pretrained_revision` pins a branch, tag or commit, as in
LeRobot); only `*.json` and `*.safetensors` files are fetched.
"""

from __future__ import annotations

import os
from pathlib import Path

from lr_config import ConfigError, check_repo_id, split_flags
from lr_config.layout import POLICY_CONFIG, PRETRAINED

__all__ = ["model_folder", "resolve_policy_path_flag"]


def _download(repo_id: str, revision: str | None) -> Path:
    """The model files of a Hub repo, from the cache or downloaded once (huggingface_hub)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=["*.json", "*.safetensors"]))
    except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
        raise ConfigError(f"--policy.path={repo_id}: {type(exc).__name__} on the Hub ({str(exc).splitlines()[0]})") from None
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as exc:
        raise ConfigError(f"--policy.path={repo_id}: the Hub could not be reached and the model is not cached "
                          f"({str(exc).splitlines()[0]}); check HF_ENDPOINT / the network, or pass a local folder") from None


def model_folder(path: str, revision: str | None) -> tuple[Path, str]:
    """(the folder holding config.json and the weights, how to name it) for `--policy.path`."""
    local = Path(path).expanduser()
    for folder in (local, local / PRETRAINED):
        if (folder / POLICY_CONFIG).is_file():
            return folder.resolve(), str(local)
    if local.exists():
        raise ConfigError(f"--policy.path={path}: no {POLICY_CONFIG} in it nor in its {PRETRAINED}/; pass a checkpoint "
                          f"step folder, its {PRETRAINED}/, a run folder, or a Hub repo id")
    try:
        check_repo_id(path, "--policy.path")  # lr-config's rule for a Hub id, as --policy.repo_id uses it
    except ConfigError:
        raise ConfigError(f"--policy.path={path}: no such folder (nor a Hub repo id of the form user/name)") from None
    folder = _download(path, revision)
    if not (folder / POLICY_CONFIG).is_file():
        raise ConfigError(f"--policy.path={path}: the Hub repo has no {POLICY_CONFIG}; is it an lr or LeRobot policy?")
    return folder, path


def resolve_policy_path_flag(flags: list[str]) -> list[str]:
    """`flags` with a Hub repo id in `--policy.path=` replaced by its downloaded folder (a local
    folder, or a value that is neither, is left for the parser to judge and name). Malformed flags
    are refused as the parser refuses them (`split_flags`, which it calls first too)."""
    values = split_flags(flags)
    path = values.get("policy.path", "").strip()
    if not path or path in ("null", "None") or Path(path).expanduser().exists():
        return flags
    try:
        check_repo_id(path, "--policy.path")
    except ConfigError:
        return flags
    revision = values.get("policy.pretrained_revision", "").strip() or None
    folder, _ = model_folder(path, None if revision in (None, "null", "None") else revision)
    if os.environ.get("RANK", "0") == "0":
        print(f"--policy.path={path}: the Hub model is in {folder}", flush=True)
    return [f"--policy.path={folder}" if flag.startswith("--policy.path=") else flag for flag in flags]
