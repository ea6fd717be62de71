"""Policies from other packages: the `lr.policies` entry point group.

A package adds a policy type by declaring, in its `pyproject.toml`,

    [project.entry-points."lr.policies"]
    tinyformer = "lr_tinyformer.config:TinyformerConfig"

The entry point's name is the type (`--policy.type=tinyformer`); its object is the policy's
config dataclass, a subclass of `PolicyConfigBase` that imports no torch, with:

- `type_name` equal to the entry point's name;
- a default for every field (`--policy.type=<name>` alone builds it), every value JSON-ready
  (the contract writes every field and reads it back strictly: unknown keys are refused);
- `chunk_size` and `n_action_steps` fields (the actions predicted per step, the actions run from
  each chunk: the dataset's action window and `select_action`'s queue follow them);
- `policy_class`, "module:Class" of the `nn.Module` that lr-engine builds from it (imported only
  by lr-engine, so lr-config, the flag parser and lr-tui read, validate and turn the config
  into a launch command without torch);
- optionally `problems(self) -> list[str]`, its own validation rules (each line names a flag),
  reported with the others by `validate`.

`policy_types()` (in `_serde`, which also checks that a plugin's defaults go through the
contract's files) is every type by name: the built-in ones, then the plugins. Any problem with a
plugin (a name that clashes with a built-in or another plugin, an import that fails, an object
that is not such a dataclass) is a `ConfigError` naming the entry point and its distribution,
raised when the types are first needed: a broken plugin stops `lr-engine train` before it
starts rather than being skipped without a word. The result is cached for the current
`sys.path`.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from ._configs import POLICY_TYPES, PolicyConfigBase
from ._errors import ConfigError

__all__ = ["ENTRY_POINT_GROUP", "discover_plugins", "plugin_policy_class_path"]

ENTRY_POINT_GROUP = "lr.policies"

_cache: tuple[tuple[str, ...], dict[str, tuple[type[PolicyConfigBase], str]]] | None = None


def discover_plugins() -> dict[str, tuple[type[PolicyConfigBase], str]]:
    """Each installed plugin's type name -> (its config class, where it comes from), checked
    here for everything but the round trip through the contract's files, which `_serde`'s
    `policy_types()` checks. Cached for the current `sys.path`."""
    global _cache
    key = tuple(sys.path)
    if _cache is None or _cache[0] != key:
        _cache = (key, _discover())
    return dict(_cache[1])


def plugin_policy_class_path(config_class: type[PolicyConfigBase]) -> str | None:
    """The "module:Class" of a plugin config's policy; None for a built-in type."""
    if POLICY_TYPES.get(config_class.type_name) is config_class:
        return None
    path: str = getattr(config_class, "policy_class")
    return path


def _discover() -> dict[str, tuple[type[PolicyConfigBase], str]]:
    from importlib.metadata import entry_points

    found: dict[str, tuple[type[PolicyConfigBase], str]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else "an unknown distribution"
        where = f"policy plugin {ep.name!r} ({ep.value}, entry point group {ENTRY_POINT_GROUP!r} of {dist})"
        if ep.name in POLICY_TYPES:
            raise ConfigError(
                f"{where}: {ep.name!r} is a built-in policy type; the plugin must use another name "
                f"(its entry point and its config's type_name), or uninstall {dist}"
            )
        if ep.name in found:
            raise ConfigError(f"{where}: the policy type {ep.name!r} is also declared by {found[ep.name][1]}; uninstall one of them")
        try:
            obj = ep.load()
        except Exception as exc:  # any failure of the plugin's own import is the plugin's problem
            raise ConfigError(f"{where}: importing it failed ({type(exc).__name__}: {exc}); fix or uninstall {dist}") from None
        found[ep.name] = (_checked(obj, ep.name, where), where)
    return found


def _checked(obj: Any, name: str, where: str) -> type[PolicyConfigBase]:
    if not (isinstance(obj, type) and issubclass(obj, PolicyConfigBase) and dataclasses.is_dataclass(obj)):
        raise ConfigError(f"{where}: the entry point must name a dataclass that subclasses lr_config.PolicyConfigBase, got {obj!r}")
    if obj.type_name != name:
        raise ConfigError(f"{where}: {obj.__name__}.type_name is {obj.type_name!r}; it must be the entry point's name, {name!r}")
    path = getattr(obj, "policy_class", None)
    if not (isinstance(path, str) and path.count(":") == 1 and all(path.split(":"))):
        raise ConfigError(f"{where}: {obj.__name__} must declare policy_class = \"module:Class\" (its nn.Module), got {path!r}")
    fields = {f.name for f in dataclasses.fields(obj)}
    lacking = [name for name in ("chunk_size", "n_action_steps") if name not in fields]
    if lacking:
        raise ConfigError(f"{where}: {obj.__name__} lacks the field(s) {', '.join(lacking)} (ints: the actions predicted per step, the actions run from each chunk)")
    try:
        obj()
    except TypeError as exc:
        raise ConfigError(f"{where}: {obj.__name__}() failed ({exc}); every field needs a default") from None
    return obj
