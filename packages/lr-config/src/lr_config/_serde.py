"""Strict (un)structuring of the contract dataclasses with cattrs.

- `make_converter()` builds a fresh strict converter: unknown keys and wrong types are
  errors (no `int(1.7)`, no `bool("false")`), every field is written, defaults included.
  A list (or tuple, set) setting takes a JSON list only: cattrs alone would split a string
  into its characters (`"q_proj"` -> `['q', '_', ...]`) and take a dict's keys. A dict setting
  with a closed key set (`closed_keys`: `normalization_mapping`, keyed by feature type)
  refuses any other key, naming it with "did you mean".
- `to_dict` / `from_dict` go through it; `from_dict` turns cattrs' error tree into one
  `ConfigError` whose lines name flag paths (`--accelerator.fsdp.min_num_params: ...`).
- `save_json` writes atomically (temp file + rename), so a crash never leaves a half file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import secrets
import types
import typing
from pathlib import Path
from collections.abc import Callable, Mapping, MutableSet
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union

from ._configs import POLICY_TYPES, PolicyConfig, PolicyConfigBase, closed_keys
from ._errors import ConfigError, did_you_mean
from ._plugins import discover_plugins

if TYPE_CHECKING:
    import cattrs

__all__ = ["check_complete", "from_dict", "load_json", "make_converter", "policy_types", "save_json", "to_dict", "converter"]

T = TypeVar("T")


def _strict_int(value: Any, _: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected int, got {value!r}")
    return value


def _strict_float(value: Any, _: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected float, got {value!r}")
    return float(value)


def _strict_bool(value: Any, _: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def _strict_str(value: Any, _: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _strict_path(value: Any, _: Any) -> Path:
    if not isinstance(value, str):
        raise TypeError(f"expected a path string, got {value!r}")
    return Path(value)


def _is_literal(tp: Any) -> bool:
    return typing.get_origin(tp) is Literal


def _strict_literal(value: Any, tp: Any) -> Any:
    choices = typing.get_args(tp)
    for choice in choices:
        if type(choice) is type(value) and choice == value:
            return choice
    raise TypeError(f"expected one of {', '.join(repr(c) for c in choices)}, got {value!r}")


class _Refused(TypeError):
    """A hook's refusal, shown as its message (no cattrs wording around it)."""


_FLAG = "\x00flag\x00"
"""Stands for the flag path in a hook's message; `_explain` puts the path in (hooks never see it)."""


def _is_collection(tp: Any) -> bool:
    from cattrs.cols import is_any_set, is_sequence

    return bool(is_sequence(tp) or is_any_set(tp) or typing.get_origin(tp) is tuple)


def _not_a_list(value: Any, tp: Any) -> _Refused:
    if isinstance(value, str):
        args = typing.get_args(tp)
        message = f"expected a JSON list, got the text {value!r}"
        if args and args[0] is str and (len(args) == 1 or args[1] is Ellipsis):
            message += f"; a list of one is {_FLAG}={shlex.quote(json.dumps([value]))}"
        else:
            message += f"; write it as JSON, as in {_FLAG}='[...]'"
        return _Refused(message)
    return _Refused(f"expected a JSON list, got {value!r}")


def _collection_factory(tp: Any, conv: cattrs.Converter) -> Callable[[Any, Any], Any]:
    """cattrs' own hook for `tp`, taking only a list or tuple (or a set for a set)."""
    from cattrs.cols import homogenous_tuple_structure_factory, is_any_set, is_mutable_sequence, list_structure_factory

    inner: Callable[[Any, Any], Any]
    origin, args = typing.get_origin(tp) or tp, typing.get_args(tp)
    if is_any_set(tp):
        as_list: Any = types.GenericAlias(list, args[:1]) if args else list
        to_list = list_structure_factory(as_list, conv)
        make: type = set if origin in (set, MutableSet) else frozenset
        inner = lambda value, _: make(to_list(value, as_list))  # noqa: E731
    elif is_mutable_sequence(tp):
        inner = list_structure_factory(tp, conv)
    elif origin is tuple and args and args[-1] is not Ellipsis:
        inner = conv.gen_structure_hetero_tuple(tp)
    else:
        inner = homogenous_tuple_structure_factory(tp, conv)

    def structure(value: Any, _: Any) -> Any:
        if not isinstance(value, (list, tuple, set, frozenset)):
            raise _not_a_list(value, tp)
        return inner(value, tp)

    return structure


def _closed_keys_hook(conv: cattrs.Converter, tp: Any, keys: tuple[str, ...]) -> Callable[[Any, Any], Any]:
    """The dict's own hook, refusing a key outside `keys` (each one reported at its path)."""
    from cattrs.errors import IterableValidationError, IterableValidationNote

    inner = conv.get_structure_hook(tp)
    key_type = typing.get_args(tp)[0] if typing.get_args(tp) else Any

    def structure(value: Any, _: Any) -> Any:
        errors: list[Exception] = []
        if isinstance(value, Mapping):
            for key in value:
                if key not in keys:
                    hint = did_you_mean(str(key), keys) or did_you_mean(str(key).upper(), keys)
                    exc = _Refused(f"unknown key{hint}; the keys are {', '.join(keys)}")
                    exc.__notes__ = [IterableValidationNote(f"Structuring mapping key @ key {key!r}", key, key_type)]
                    errors.append(exc)
        try:
            result = inner(value, tp)
        except IterableValidationError as exc:
            # a refused key's value is not reported as well
            rest = [e for e in exc.exceptions if not any(
                isinstance(n, IterableValidationNote) and n.index not in keys for n in getattr(e, "__notes__", []))]
            raise IterableValidationError(str(exc.message), [*errors, *rest], tp) from None
        if errors:
            raise IterableValidationError(f"While structuring {tp!r}", errors, tp)
        return result

    return structure


def _has_closed_keys(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp) and any(closed_keys(f) for f in dataclasses.fields(tp))


def _closed_keys_factory(cls: Any, conv: cattrs.Converter) -> Callable[[Any, Any], Any]:
    from cattrs.gen import make_dict_structure_fn, override

    field_types = hints(cls)
    overrides: dict[str, Any] = {
        f.name: override(struct_hook=_closed_keys_hook(conv, field_types[f.name], keys))
        for f in dataclasses.fields(cls)
        if (keys := closed_keys(f))
    }
    return make_dict_structure_fn(cls, conv, **overrides)


_ROUND_TRIPPED: set[type[PolicyConfigBase]] = set()


def policy_types() -> dict[str, type[PolicyConfigBase]]:
    """Every policy type by name: built-ins (`act`, `mlp`) first, then the installed plugins
    (`_plugins`), each plugin's defaults checked to survive the contract's files once: written
    with every field, read back strictly, equal."""
    types_: dict[str, type[PolicyConfigBase]] = dict(POLICY_TYPES)
    for name, (cls, where) in discover_plugins().items():
        if cls not in _ROUND_TRIPPED:
            _check_round_trip(cls, where)
            _ROUND_TRIPPED.add(cls)
        types_[name] = cls
    return types_


def _check_round_trip(cls: type[PolicyConfigBase], where: str) -> None:
    default = cls()
    try:
        back = from_dict(cls, to_dict(default), source=f"{cls.__name__}()")
    except Exception as exc:
        raise ConfigError(f"{where}: {cls.__name__}'s defaults do not go through lr's config files ({exc})") from None
    if back != default:
        raise ConfigError(f"{where}: {cls.__name__}'s defaults change when written and read back; use JSON types (int, float, str, bool, list, dict, Path)")


def _policy_union_hooks(conv: cattrs.Converter) -> None:
    """The policy block, tagged by `type`, over every policy type (`policy_types()`: the
    built-ins and the installed plugins, so the union is not fixed when this module loads)."""

    def structure(value: Any, _: Any) -> PolicyConfigBase:
        if not isinstance(value, Mapping):
            raise _Refused(f"expected a JSON object with a type, got {value!r}")
        types_ = policy_types()
        kind = value.get("type")
        if not isinstance(kind, str) or kind not in types_:
            raise _Refused(f"unknown policy type {kind!r}{did_you_mean(str(kind), types_)}; known types: {', '.join(types_)}")
        rest = {k: v for k, v in value.items() if k != "type"}
        config: PolicyConfigBase = conv.structure(rest, types_[kind])
        return config

    def unstructure(obj: PolicyConfigBase) -> dict[str, Any]:
        return {"type": obj.type_name, **conv.unstructure(obj, type(obj))}

    def is_the_union(tp: Any) -> bool:  # exactly: a hook on the base class would catch its subclasses too
        return tp is PolicyConfigBase or tp == PolicyConfig

    conv.register_structure_hook_func(is_the_union, structure)
    conv.register_unstructure_hook_func(is_the_union, unstructure)


def make_converter() -> cattrs.Converter:
    """A new strict JSON converter for every contract dataclass."""
    from cattrs.preconf.json import make_converter as _json_converter

    conv = _json_converter(forbid_extra_keys=True, omit_if_default=False)
    conv.register_structure_hook(int, _strict_int)
    conv.register_structure_hook(float, _strict_float)
    conv.register_structure_hook(bool, _strict_bool)
    conv.register_structure_hook(str, _strict_str)
    conv.register_structure_hook(Path, _strict_path)
    conv.register_structure_hook_func(_is_literal, _strict_literal)
    conv.register_structure_hook_factory(_is_collection, _collection_factory)
    conv.register_structure_hook_factory(_has_closed_keys, _closed_keys_factory)
    conv.register_unstructure_hook(Path, str)
    _policy_union_hooks(conv)
    return conv


_converter: cattrs.Converter | None = None


def _conv() -> cattrs.Converter:
    """The shared converter, built on first use: importing cattrs costs about as much as the rest
    of `import lr_config`, and a tool that only reads flags' help or topology never needs it."""
    global _converter
    if _converter is None:
        _converter = make_converter()
    return _converter


def __getattr__(name: str) -> Any:
    if name == "converter":
        return _conv()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def to_dict(obj: Any) -> dict[str, Any]:
    """Every field of a contract dataclass as JSON-ready data."""
    data: dict[str, Any] = _conv().unstructure(obj)
    return data


def _flag_path(path: str) -> str:
    """`$.accelerator.fsdp['x']` or `config.a.b[0]` -> `--accelerator.fsdp.x`."""
    path = path.split(" @ ")[-1]
    for prefix in ("$", "config"):
        if path.startswith(prefix):
            path = path[len(prefix):]
    path = path.replace("['", ".").replace("']", "")
    return "--" + path.lstrip(".")


def _format_exception(exc: BaseException, type_: Any) -> str:
    import cattrs

    if isinstance(exc, _Refused) or (isinstance(exc, TypeError) and str(exc).startswith("expected")):
        return str(exc)
    return cattrs.v.format_exception(exc, type_)


def _explain(exc: Exception, cls: type, data: Any) -> list[str]:
    import cattrs

    if not isinstance(exc, (cattrs.BaseValidationError,)):
        return [str(exc)]
    lines: list[str] = []
    for line in cattrs.transform_error(exc, path="$", format_exception=_format_exception):
        where = _flag_path(line)
        what = line.split(" @ ")[0]
        if what.startswith("extra fields found"):
            parent = where
            keys = what.split("(")[-1].rstrip(")") if "(" in what else what.split(":")[-1]
            for key in [k.strip() for k in keys.split(",") if k.strip()]:
                full = (parent.rstrip(".") + "." + key) if parent != "--" else "--" + key
                lines.append(f"{full}: {_unknown_key(cls, data, parent, key)}")
            continue
        lines.append(f"{where}: {what.replace(_FLAG, where)}")
    return lines


def _unknown_key(cls: type, data: Any, parent: str, key: str) -> str:
    """Why `key` is refused under `parent`, with the closest known names."""
    known = _known_keys_at(cls, parent)
    if key in known:
        # The union's fields are known, so this belongs to another tagged type (--policy.type).
        node = data
        for part in [p for p in parent.removeprefix("--").split(".") if p]:
            node = node.get(part) if isinstance(node, dict) else None
        kind = node.get("type") if isinstance(node, dict) else None
        return f"not a setting of {parent}.type={kind}"
    return f"unknown setting{did_you_mean(key, known)}"


def _known_keys_at(cls: type, flag: str) -> list[str]:
    return field_names_at(cls, flag.removeprefix("--"))


def from_dict(cls: type[T], data: Any, *, source: str = "config") -> T:
    """Structure `data` into `cls` strictly, or raise a ConfigError naming flag paths."""
    problem = None
    if getattr(cls, "__name__", "") == "TrainConfig" and isinstance(data, dict):
        problem = _policy_type_problem(data.get("policy"), "--policy.type")
    elif cls == PolicyConfig:  # a saved policy's config.json
        problem = _policy_type_problem(data, "--type")
    if problem is not None:
        raise ConfigError(f"invalid {source}:\n  {problem}", problems=[problem])
    try:
        return _conv().structure(data, cls)
    except Exception as exc:  # cattrs raises several kinds; all are user input problems
        problems = _explain(exc, cls, data)
        raise ConfigError(f"invalid {source}:\n  " + "\n  ".join(problems), problems=problems) from None


def _policy_type_problem(policy: Any, flag: str) -> str | None:
    """Why the policy block's `type` tag is not a known type's name, if it is not (the tagged
    union needs one to pick the class; a list or dict there would fail as an unhashable lookup)."""
    if not isinstance(policy, dict):
        return None
    types_ = policy_types()
    known = f"known types: {', '.join(types_)}"
    if "type" not in policy:
        return f"{flag}: missing; {known}"
    kind = policy["type"]
    if not isinstance(kind, str):
        return f"{flag}: expected a policy type name, got {kind!r}; {known}"
    if kind not in types_:
        return f"{flag}: unknown policy type {kind!r}{did_you_mean(kind, types_)}; {known}"
    return None


def _new_temp_file(path: Path) -> tuple[int, str]:
    """A new file beside `path` under a unique temp name, opened for writing. Its mode is what
    the umask gives (0644 under the usual 022), as for any file the user writes: mkstemp's
    0600 would leave checkpoints and configs unreadable to the rest of a team."""
    while True:
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


def save_json(path: Path, data: Any) -> None:
    """Write JSON atomically: a temp file in the same folder, fsync, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _new_temp_file(path)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json_object(
    path: Path, *, error: type[ConfigError] = ConfigError, prefix: str = "", missing: str = ": file not found", damaged: str = ""
) -> dict[str, Any]:
    """The JSON object in `path`: the one reader of lr's JSON files (contracts, checkpoint state,
    dataset metadata, processors, publish folders). Every failure is an `error` whose message
    starts with `prefix` and the path: `missing` follows it when the file is not there,
    `damaged` ends the message of a file that is not JSON or not an object."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise error(f"{prefix}{path}{missing}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{prefix}{path}: not valid JSON ({exc}){damaged}") from None
    if not isinstance(data, dict):
        raise error(f"{prefix}{path}: expected a JSON object{damaged}")
    return data


def load_json(
    path: Path, cls: type[T], *, current_version: int, upgrades: Mapping[int, Callable[[dict[str, Any]], dict[str, Any]]] | None = None
) -> T:
    """Read a versioned contract file; refuse unknown versions and name the file.

    `upgrades[v]` turns a version-v object into the next version's (and sets its `version`);
    they are applied in turn up to `current_version`, then the result is checked strictly."""
    path = Path(path)
    data = read_json_object(path)
    version = data.get("version")
    while isinstance(version, int) and version != current_version and version in (upgrades or {}):
        data = (upgrades or {})[version](data)
        version = data.get("version")
    if version != current_version:
        raise ConfigError(
            f"{path}: schema version {version!r} is not supported (this lr reads version {current_version}); "
            "upgrade lr or re-create the file"
        )
    check_complete(cls, data, str(path))
    return from_dict(cls, data, source=str(path))


def check_complete(cls: type, data: dict[str, Any], where: str, *, what: str = "file") -> None:
    """Refuse `data` when it lacks a field of `cls`: lr writes every field, defaults included,
    so a missing one means the `what` (a file, a metrics line) was cut short or edited."""
    missing = missing_fields(cls, data)
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise ConfigError(
            f"{where}: incomplete {what}, missing {shown}; lr writes every field, so this {what} was cut short "
            "or edited: restore it, or re-create it"
        )


def _dataclass_of(tp: Any, value: Any) -> type | None:
    """The dataclass a field holds (the tagged policy class for the union), else None."""
    args = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_origin(tp) in (typing.Union, types.UnionType) else [tp]
    classes: list[type] = [a for a in args if isinstance(a, type) and dataclasses.is_dataclass(a)]
    if len(classes) > 1 and isinstance(value, dict):
        return next((c for c in classes if getattr(c, "type_name", None) == value.get("type")), None)
    return classes[0] if len(classes) == 1 else None


def missing_fields(cls: type, data: dict[str, Any], prefix: str = "") -> list[str]:
    """Flag paths of the fields a saved file lacks (files hold every field, defaults included)."""
    missing: list[str] = []
    field_types = hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        if f.name not in data:
            missing.append(f"--{path}")
            continue
        tp, value = field_types[f.name], data[f.name]
        inner = _dataclass_of(tp, value)
        if inner is not None and isinstance(value, dict):
            missing += missing_fields(inner, value, path + ".")
        elif typing.get_origin(tp) is dict and isinstance(value, dict):  # dict[str, SomeDataclass]: each entry
            entry_type = _dataclass_of(typing.get_args(tp)[1], None)
            if entry_type is not None:
                for key, entry in value.items():
                    if isinstance(entry, dict):
                        missing += missing_fields(entry_type, entry, f"{path}.{key}.")
    return missing


_HINTS: dict[type, dict[str, Any]] = {}


def hints(cls: type) -> dict[str, Any]:
    """Resolved type hints of a dataclass (annotations are strings in our modules); do not mutate.

    Cached: resolving them is slow, and flag parsing asks for them once per field.
    """
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def unwrap_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def policy_classes(tp: Any) -> list[type[PolicyConfigBase]] | None:
    """Every policy config class (the installed plugins' too) when `tp` is the policy union."""
    tp = unwrap_optional(tp)
    if tp is PolicyConfigBase:
        return list(policy_types().values())
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = typing.get_args(tp)
        if all(isinstance(a, type) and issubclass(a, PolicyConfigBase) for a in args):
            return list(policy_types().values())
    return None


def fields_of(tp: Any) -> dict[str, Any] | None:
    """Field name -> type for a dataclass or the policy union; None for leaves."""
    classes = policy_classes(tp)
    if classes is not None:
        merged: dict[str, Any] = {"type": str}
        for cls in classes:
            h = hints(cls)
            merged.update({f.name: h[f.name] for f in dataclasses.fields(cls)})
        return merged
    tp = unwrap_optional(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        h = hints(tp)
        return {f.name: h[f.name] for f in dataclasses.fields(tp)}
    return None


def field_names_at(root: type, dotted: str) -> list[str]:
    """Names of the settings under a flag group ('' is the top level)."""
    tp: Any = root
    for part in [p for p in dotted.split(".") if p]:
        fields = fields_of(tp)
        if fields is None or part not in fields:
            return []
        tp = fields[part]
    return list(fields_of(tp) or {})
