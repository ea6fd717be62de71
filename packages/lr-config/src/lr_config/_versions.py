"""`--version` of every lr command: the installed versions of lr's packages and of torch.

Read from the installed distributions' metadata (`importlib.metadata`), so it imports
neither torch nor the packages themselves, and answers in a fraction of a second.
"""

from __future__ import annotations

from importlib import metadata

__all__ = ["VERSION_FLAG", "versions_text"]

VERSION_FLAG = "--version"
"""Asked alone (no `=value`): the package versions. `--version=N` is the config schema's field."""

_PACKAGES = ("lr-config", "lr-checkpoint", "lr-publish", "lr-engine", "lr-tui", "torch")


def versions_text(prog: str) -> str:
    """`<prog> <its version>` then one line per installed lr package and torch."""
    found = {}
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    package = prog if prog in found else "lr-config"
    lines = [f"{prog} {found.get(package, 'unknown')}"]
    lines += [f"  {name} {version}" for name, version in found.items()]
    return "\n".join(lines)
