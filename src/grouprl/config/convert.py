"""Values to the fields' types, nested dicts to dataclasses and back, YAML files in and out."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml

from grouprl.config.fields import (
    ConfigError,
    _hints,
    _init_fields,
    _is_dataclass_type,
    _is_union,
    _section_type,
    _unknown_keys_error,
    apply_renames,
    refuse_retired,
    type_name,
)
from grouprl.config.run_checks import check
from grouprl.run.files import as_plain, write_text_atomic
from grouprl.trainer.config import TrainerConfig

TRUE_WORDS = frozenset({"true", "yes", "on", "1"})
FALSE_WORDS = frozenset({"false", "no", "off", "0"})
NONE_WORDS = frozenset({"none", "null", "~", ""})
"""Words that mean "empty" for an optional key."""


def _type_error(key: str, tp: Any, value: Any, expected: str | None = None) -> ConfigError:
    return ConfigError(f"Invalid value for {key!r}: expected {expected or type_name(tp)}, got {value!r} "
                       f"({type(value).__name__}).")


def _to_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower() if isinstance(value, str | int) else None
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise _type_error(key, bool, value, "bool (true or false)")


def _to_int(value: Any, key: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    number: Any = value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            number = _float_or_none(value)  # "1e3" is an integer written in float notation
    if isinstance(number, float) and number.is_integer():
        return int(number)
    raise _type_error(key, int, value)


def _float_or_none(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def _to_float(value: Any, key: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    # PyYAML reads "1e-6" (no dot) as a string, so strings are parsed here too.
    number = _float_or_none(value) if isinstance(value, str) else None
    if number is None:
        raise _type_error(key, float, value)
    return number


def _to_str(value: Any, key: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)  # YAML turns `run_name: 2024` into an int; the user meant the text
    raise _type_error(key, str, value)


_SCALARS = {bool: _to_bool, int: _to_int, float: _to_float, str: _to_str}


def _convert_literal(value: Any, tp: Any, key: str) -> Any:
    choices = get_args(tp)
    for choice in choices:
        if value == choice and type(value) is type(choice):
            return choice
    for choice in choices:  # command-line values arrive as text
        if isinstance(value, str) and value.strip() == str(choice):
            return choice
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"Invalid value for {key!r}: {value!r} is not one of {type_name(tp)}.{hint}")


def _as_items(value: Any, key: str, tp: Any) -> list[Any]:
    """A list from YAML (a sequence) or the command line (``a,b,c`` or YAML ``[a, "b,c"]``)."""
    if isinstance(value, list | tuple):
        return list(value)
    if not isinstance(value, str):
        raise _type_error(key, tp, value)
    text = value.strip()
    if text.startswith("["):
        try:
            parsed = yaml.safe_load(text)
        except yaml.YAMLError:
            parsed = None
        if not isinstance(parsed, list):
            raise _type_error(key, tp, value, f"{type_name(tp)} written as a,b,c or [a, b, c]")
        return parsed
    return [] if not text else [part.strip() for part in text.split(",")]


def _convert_sequence(value: Any, tp: Any, key: str) -> tuple | list:
    origin, args = get_origin(tp), get_args(tp)
    items = _as_items(value, key, tp)
    if origin is list:
        elem = args[0] if args else Any
        return [_convert(v, elem, f"{key}[{i}]") for i, v in enumerate(items)]
    if not args or (len(args) == 2 and args[1] is Ellipsis):
        elem = args[0] if args else Any
        return tuple(_convert(v, elem, f"{key}[{i}]") for i, v in enumerate(items))
    if len(items) != len(args):
        raise _type_error(key, tp, value, f"{type_name(tp)} (exactly {len(args)} items)")
    return tuple(_convert(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(items, args)))


def _convert_dict(value: Any, tp: Any, key: str) -> dict:
    if isinstance(value, str):  # the command line gives a YAML/JSON mapping as text
        with contextlib.suppress(yaml.YAMLError):  # not YAML: reported as a type error below
            value = yaml.safe_load(value) if value.strip() else {}
    if not isinstance(value, Mapping):
        raise _type_error(key, tp, value, f"{type_name(tp)} (a mapping)")
    kt, vt = get_args(tp) or (Any, Any)
    return {_convert(k, kt, key): _convert(v, vt, f"{key}.{k}") for k, v in value.items()}


def _convert_union(value: Any, tp: Any, key: str) -> Any:
    args = get_args(tp)
    if type(None) in args and (value is None or (isinstance(value, str) and value.strip().lower() in NONE_WORDS)):
        return None
    rest = [a for a in args if a is not type(None)]
    if any(type(value) is a for a in rest):  # already the right type: 3 stays an int in int | float
        return value
    for option in rest:
        try:
            return _convert(value, option, key)
        except ConfigError:
            continue
    raise _type_error(key, tp, value)


def _convert(value: Any, tp: Any, key: str) -> Any:
    """``value`` (from YAML or the command line) as annotation ``tp``; ``key`` names it in errors."""
    if tp is Any:
        return value
    if _is_union(tp):
        return _convert_union(value, tp, key)
    origin = get_origin(tp)
    if origin is Literal:
        return _convert_literal(value, tp, key)
    if origin in (tuple, list) or tp in (tuple, list):
        return _convert_sequence(value, tp, key)
    if origin is dict or tp is dict:
        return _convert_dict(value, tp, key)
    if _is_dataclass_type(tp):
        if isinstance(value, Mapping):
            return _build(tp, value, key, tp)
        raise _type_error(key, tp, value, f"a mapping of the fields of section {key!r}")
    if tp in _SCALARS:
        return _SCALARS[tp](value, key)
    if value is None and tp is type(None):
        return None
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    if isinstance(tp, type) and isinstance(value, str):
        return tp(value)  # Path and other types built from their text form
    raise _type_error(key, tp, value)


def _build(cls: type, data: Mapping, where: str, root: type) -> Any:
    if not isinstance(data, Mapping):
        raise _type_error(where or "config", cls, data, "a mapping of keys to values")
    data = apply_renames(cls, data, where)
    refuse_retired(cls, data, where)
    fields = {f.name: f for f in _init_fields(cls)}
    unknown = [str(k) for k in data if k not in fields]
    if unknown:
        full = [f"{where}.{k}" if where else k for k in unknown]
        raise _unknown_keys_error(root, full, cls, where, "")
    hints = _hints(cls)
    kwargs = {}
    for name, value in data.items():
        if isinstance(value, Mapping) and _section_type(hints[name]) is not None:
            value = _merge(_section_default(fields[name]), value)
        kwargs[name] = _convert(value, hints[name], f"{where}.{name}" if where else name)
    missing = [f"{where}.{n}" if where else n for n, f in fields.items()
               if n not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"Missing required config key(s): {', '.join(missing)}.")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as e:  # a __post_init__ check: say which section it came from
        raise ConfigError(f"Invalid config{f' section {where!r}' if where else ''}: {e}") from e


def _section_default(f: dataclasses.Field) -> dict[str, Any]:
    """The default of section field ``f`` (its parent's ``default_factory``'s) as a dict, for YAML to override."""
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return to_dict(default) if dataclasses.is_dataclass(default) and not isinstance(default, type) else {}


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
        out[key] = _merge(out[key], value) if both else value
    return out


def from_dict(cls: type, data: Mapping[str, Any]) -> Any:
    """Dataclass ``cls`` from a plain mapping such as loaded YAML, values converted, missing keys at their defaults;
    a trainer's config is checked (:func:`~grouprl.config.check`). Every mistake is a :class:`ConfigError`."""
    if not _is_dataclass_type(cls):
        raise TypeError(f"from_dict needs a dataclass type, got {cls!r}")
    config = _build(cls, data, "", cls)
    if isinstance(config, TrainerConfig):
        check(config)
    return config


def to_dict(obj: Any) -> dict[str, Any]:
    """Dataclass instance -> plain dict of YAML types; ``from_dict(type(obj), to_dict(obj)) == obj``."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise TypeError(f"to_dict needs a dataclass instance, got {obj!r}")
    return as_plain(obj)


def yaml_text(obj: Any) -> str:
    """A dataclass instance (or plain dict) as YAML, keys in their order."""
    data = obj if isinstance(obj, Mapping) else to_dict(obj)
    return yaml.safe_dump(as_plain(data), sort_keys=False, allow_unicode=True, default_flow_style=False)


def save_yaml(obj: Any, path: str | os.PathLike) -> Path:
    """Write a dataclass instance (or plain dict) as YAML, atomically."""
    write_text_atomic(Path(path), yaml_text(obj))
    return Path(path)


def read_yaml_mapping(path: str | os.PathLike) -> dict[str, Any]:
    """The top-level mapping of a YAML file (empty file -> {}), with ConfigErrors naming the file."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"Config file {path} does not exist.") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise ConfigError(f"Config file {path}, line {line}: byte {raw[e.start]:#04x} is not UTF-8; save the file "
                          "as UTF-8") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        detail = " ".join(str(e).split())
        raise ConfigError(f"Config file {path} is not valid YAML: {detail}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"Config file {path} must hold a mapping of keys to values, not a {type(data).__name__}.")
    return dict(data)
