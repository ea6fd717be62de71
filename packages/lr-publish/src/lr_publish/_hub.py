"""Pushing a checked publish folder to the Hub, with bounded retries (main rank only).

The push is `HfApi(endpoint=...).create_repo(exist_ok=True)`, `create_branch(exist_ok=True)`
for a non-main `--revision`, then one `upload_folder` commit. Around it:

- private: `create_repo` makes a new repo private but never changes an existing one's
  visibility, so a push asked to be private reads the repo's (`repo_info(...).private`)
  and, when the repo is public, uploads nothing: `HubPushError` saying how to proceed (make
  it private on the Hub, or another repo). Visibility is never changed here.
- stale files: the commit also deletes (`delete_patterns`, the exact names) the files lr
  writes (`is_published_name`: weights, adapter, configs, processors) that an earlier push
  left at the top of the branch and this folder does not have, so full weights pushed over
  a LoRA adapter leave no adapter files (and the reverse). Files lr never writes (the
  user's own, anything in a subfolder) and `.gitattributes` stay; README.md is always
  replaced by the new card.

Every step is idempotent, so a failed attempt is retried whole:

- transient failures (connection refused or dropped, timeouts, HTTP 408/429/5xx) are
  retried `LR_HUB_RETRIES` times in all (default 5), waiting `LR_HUB_RETRY_BASE_S` (default
  2 s) doubled after each failure, at most 60 s; then `HubUnavailableError`;
- anything else the Hub refuses (401, 403, 404, bad metadata) is `HubPushError` at once,
  with what to fix.

Both errors carry the exact `lr-publish --folder=...` command that retries the push. The
endpoint is always passed to `HfApi` explicitly (huggingface_hub reads `HF_ENDPOINT` only at
import). The token is never put in a message: any error text is scrubbed of it.
"""

from __future__ import annotations

import glob
import logging
import os
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
from huggingface_hub import HfApi, get_token
from huggingface_hub.errors import HfHubHTTPError
from lr_config import check_repo_id

from ._errors import HubPushError, HubUnavailableError, PublishError
from ._folder import is_published_name

__all__ = ["HubTarget", "RetryPolicy", "check_publish_settings", "push_folder", "resolve_endpoint", "retry_command"]

log = logging.getLogger("lr_publish")

DEFAULT_ENDPOINT = "https://huggingface.co"
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class HubTarget:
    """Where a folder goes: repo, visibility, branch and endpoint (already resolved)."""

    repo_id: str
    endpoint: str
    private: bool = False
    revision: str | None = None


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    base_s: float = 2.0
    max_s: float = 60.0

    @classmethod
    def from_env(cls) -> RetryPolicy:
        """`LR_HUB_RETRIES` (attempts in all) and `LR_HUB_RETRY_BASE_S` (first wait)."""
        attempts = _env_number("LR_HUB_RETRIES", "5", int, minimum=1)
        base_s = _env_number("LR_HUB_RETRY_BASE_S", "2", float, minimum=0)
        return cls(attempts=int(attempts), base_s=float(base_s))

    def waits(self) -> Iterator[float]:
        """The wait before each retry: attempts - 1 values."""
        for i in range(self.attempts - 1):
            yield min(self.max_s, self.base_s * 2**i)


def _env_number(name: str, default: str, kind: type[int] | type[float], *, minimum: float) -> int | float:
    raw = os.environ.get(name, default)
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise PublishError(f"{name}={raw!r}: expected a number >= {minimum:g}; unset it for the default ({default})")
    return value


def resolve_endpoint(endpoint: str | None) -> str:
    """`--hub.endpoint` / `--endpoint`, else `HF_ENDPOINT`, else huggingface.co."""
    return (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _resolve_token(token: str | None) -> str:
    found = token or get_token()
    if not found:
        raise PublishError(
            "no Hugging Face token found: run `hf auth login` or set HF_TOKEN to a token with write access"
        )
    return found


def check_publish_settings(repo_id: str, *, token: str | None = None, flag: str = "--repo_id") -> None:
    """Fail before any work or network call: a valid `user/name`, a token to push with, sound retry settings."""
    check_repo_id(repo_id, flag=flag)
    _resolve_token(token)
    RetryPolicy.from_env()


def retry_command(folder: Path, target: HubTarget) -> str:
    """The `lr-publish --folder=...` command that pushes `folder` to `target` again."""
    args = ["lr-publish", f"--folder={Path(folder).resolve()}", f"--repo_id={target.repo_id}"]
    if target.private:
        args.append("--private=true")
    if target.revision:
        args.append(f"--revision={target.revision}")
    if target.endpoint != DEFAULT_ENDPOINT:
        args.append(f"--endpoint={target.endpoint}")
    return shlex.join(args)


def _status(exc: BaseException) -> int | None:
    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        return int(exc.response.status_code)
    return None


def _hub_failure(exc: BaseException) -> BaseException | None:
    """The Hub error behind `exc` (huggingface_hub wraps LFS upload errors in RuntimeError), if any."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, (HfHubHTTPError, httpx2.TransportError)):
            return cause
        cause = cause.__cause__
    return exc if isinstance(exc, ValueError) else None


def _is_transient(exc: BaseException) -> bool:
    return isinstance(exc, httpx2.TransportError) or _status(exc) in _TRANSIENT_STATUS


def _describe(exc: BaseException) -> str:
    status = _status(exc)
    if status is None:
        return f"{type(exc).__name__}: {exc}"
    said = getattr(exc, "server_message", None)
    return f"HTTP {status}" + (f" ({said})" if said else "")


def _refusal(exc: BaseException, target: HubTarget) -> str:
    """What went wrong and what to change, for a permanent failure."""
    status = _status(exc)
    namespace = target.repo_id.split("/")[0]
    if status == 401:
        return (f"the Hub at {target.endpoint} refused the token ({_describe(exc)}): log in with `hf auth login` "
                "or set HF_TOKEN to a valid token with write access")
    if status == 403:
        return (f"the token may not write to {target.repo_id} ({_describe(exc)}): use a token with write access "
                f"to the '{namespace}' namespace, or change --repo_id")
    if status == 404:
        return (f"{target.repo_id} (revision {target.revision or 'main'}) was not found ({_describe(exc)}): "
                "check --repo_id and --revision, and that the token can see the repo")
    if status is not None:
        return f"the Hub refused the push ({_describe(exc)})"
    return f"the Hub client refused the push: {exc}"


def _public_repo(target: HubTarget) -> str:
    return (
        f"{target.repo_id} is public on {target.endpoint}, and this push asked for a private repo: lr-publish never "
        "changes an existing repo's visibility, so it uploaded nothing. Make the repo private on the Hub (its "
        f"Settings page, or `hf repos settings {target.repo_id} --private`) and retry, or publish to a new "
        "private repo under another repo id, or leave private=true out to publish it publicly"
    )


def _stale_files(api: HfApi, folder: Path, target: HubTarget) -> list[str]:
    """Files lr writes that an earlier push left at the top of the branch and `folder` lacks."""
    remote = api.list_repo_files(target.repo_id, revision=target.revision)
    return sorted(p for p in remote if "/" not in p and is_published_name(p) and not (folder / p).is_file())


def _push_once(api: HfApi, folder: Path, target: HubTarget, command: str) -> str:
    url = str(api.create_repo(target.repo_id, private=target.private, exist_ok=True))
    if target.private and api.repo_info(target.repo_id).private is not True:
        raise HubPushError(_public_repo(target), folder=folder, retry_command=command)
    if target.revision and target.revision != "main":
        api.create_branch(target.repo_id, branch=target.revision, exist_ok=True)
        url = f"{url}/tree/{target.revision}"
    stale = _stale_files(api, folder, target)
    if stale:
        log.info("Removing files an earlier push left that this one replaces: %s", ", ".join(stale))
    api.upload_folder(
        repo_id=target.repo_id,
        folder_path=folder,
        revision=target.revision,
        commit_message="Upload policy with lr-publish",
        delete_patterns=[glob.escape(name) for name in stale] or None,  # exact names: patterns would match subfolders
    )
    return url


def push_folder(folder: Path, target: HubTarget, *, token: str | None = None) -> str:
    """Push a checked folder; return the repo url. Raises HubPushError / HubUnavailableError."""
    check_repo_id(target.repo_id, flag="--repo_id")
    secret = _resolve_token(token)
    policy = RetryPolicy.from_env()
    api = HfApi(endpoint=target.endpoint, token=secret)
    command = retry_command(folder, target)
    for attempt, wait in enumerate([*policy.waits(), None], start=1):
        try:
            return _push_once(api, folder, target, command)
        except PublishError:
            raise
        except Exception as raised:
            exc = _hub_failure(raised)
            if exc is None:
                raise
            if not _is_transient(exc):
                raise HubPushError(_scrub(_refusal(exc, target), secret), folder=folder,
                                   retry_command=command, status=_status(exc)) from None
            if wait is None:
                message = (f"the Hub at {target.endpoint} failed {policy.attempts} times in a row "
                           f"(last: {_describe(exc)}); it may be down or overloaded")
                raise HubUnavailableError(_scrub(message, secret), folder=folder, retry_command=command,
                                          status=_status(exc)) from None
            log.warning("Hub push attempt %d/%d failed (%s); retrying in %.2f s",
                        attempt, policy.attempts, _scrub(_describe(exc), secret), wait)
            time.sleep(wait)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _scrub(text: str, secret: str) -> str:
    return text.replace(secret, "<token>")
