"""`lr-publish`: push a checkpoint, or a publish folder built before, to the Hugging Face Hub.

    lr-publish --checkpoint_dir=DIR --repo_id=user/name [--private=true] [--revision=BRANCH]
               [--endpoint=URL] [--folder=OUT]
    lr-publish --folder=OUT --repo_id=user/name [...]      push OUT as it is (the retry)

Exit codes: 0 pushed; 2 something to change (a flag, the checkpoint, the token, a publish
folder that cannot be written, a Hub refusal such as 401/403/404, a public repo for
--private=true), nothing overwritten; 1 the Hub stayed unreachable through every retry. On 1
and on a Hub refusal the message ends with the exact command that retries the push. A push
replaces what lr wrote before in the repo: files lr writes that the new folder lacks (the
other weight kind's, old processors) are deleted in the same commit; other files stay.
Also runs as `python -m lr_publish.cli`.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from lr_config import VERSION_FLAG, ConfigError, did_you_mean, split_flags, versions_text
from lr_config.layout import CHECKPOINTS, LAST, PRETRAINED

from ._errors import PublishError
from ._publish import publish_checkpoint, publish_folder

__all__ = ["main"]

FLAGS = {
    "checkpoint_dir": f"A checkpoint: step folder, its {PRETRAINED}/, {CHECKPOINTS}/{LAST}, or the run folder.",
    "repo_id": "Hub repo to push to: user/name.",
    "private": "true publishes to a private repo: a new repo is created private; an existing public repo is "
               "refused before any upload (its visibility is never changed: make it private on the Hub first).",
    "revision": "Branch to push to (created from main when missing); main when unset.",
    "endpoint": "Hub endpoint; HF_ENDPOINT or https://huggingface.co when unset.",
    "folder": "Publish folder: where --checkpoint_dir's files are gathered (default <output_dir>/publish/<name>-<step>, "
              "or publish/<name>-<step> beside a step folder that is not in a run's checkpoints/), "
              "or, alone, a folder built before to push as it is.",
    "help": "Show this help.",
}


def usage() -> str:
    lines = [
        "usage: lr-publish --checkpoint_dir=DIR --repo_id=user/name [--private=true] [--revision=BRANCH] "
        "[--endpoint=URL] [--folder=OUT]",
        "       lr-publish --folder=OUT --repo_id=user/name [...]   (push a publish folder built before)",
        "",
        "The token comes from HF_TOKEN or `hf auth login`; it is never written anywhere.",
        "",
    ]
    lines += [f"  --{name}\n      {text}" for name, text in FLAGS.items()]
    return "\n".join(lines)


def _parse(argv: list[str]) -> dict[str, str]:
    flags = split_flags(argv)
    for name, value in flags.items():
        if name not in FLAGS:
            hint = did_you_mean(f"--{name}", [f"--{known}" for known in FLAGS], n=1)
            raise ConfigError(f"--{name}: unknown flag{hint}. Run lr-publish --help to list the flags.")
        if not value:
            raise ConfigError(f"--{name}: empty value; give --{name}=VALUE or leave the flag out")
    if "private" in flags and flags["private"] not in ("true", "false"):
        raise ConfigError(f"--private: expected true or false, got {flags['private']!r}")
    if "repo_id" not in flags:
        raise ConfigError("--repo_id: required (the Hub repo to push to, user/name)")
    if "checkpoint_dir" not in flags and "folder" not in flags:
        raise ConfigError("give --checkpoint_dir=DIR, or --folder=OUT to push a publish folder built before")
    return flags


def _run(flags: dict[str, str]) -> str:
    repo_id, private = flags["repo_id"], flags.get("private") == "true"
    endpoint, revision = flags.get("endpoint"), flags.get("revision")
    folder = Path(flags["folder"]) if "folder" in flags else None
    if "checkpoint_dir" in flags:
        return publish_checkpoint(Path(flags["checkpoint_dir"]), repo_id, private=private, endpoint=endpoint,
                                  revision=revision, folder=folder)
    return publish_folder(Path(flags["folder"]), repo_id, private=private, endpoint=endpoint, revision=revision)


class _StdoutHandler(logging.Handler):
    """Log lines to whatever sys.stdout is at the time (the CLI's progress and result)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(self.format(record), file=sys.stdout, flush=True)


def _log_to_stdout() -> None:
    logger = logging.getLogger("lr_publish")
    if not any(isinstance(h, _StdoutHandler) for h in logger.handlers):
        logger.addHandler(_StdoutHandler())
    logger.setLevel(logging.INFO)
    logger.propagate = False


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if VERSION_FLAG in args:
        print(versions_text("lr-publish"))
        return 0
    if "--help" in args or "-h" in args:
        print(usage())
        return 0
    _log_to_stdout()
    try:
        _run(_parse(args))
    except PublishError as exc:
        print(f"lr-publish: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except ConfigError as exc:
        print(f"lr-publish: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
