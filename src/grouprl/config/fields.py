"""Dataclass fields as config keys: their types, their docstrings, the closest valid keys for a misspelt one."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import textwrap
import types
import typing
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin

from grouprl.errors import ConfigError
from grouprl.trainer.config import retired_message


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed) for ``X | None``; others unchanged."""
    if not _is_union(tp):
        return tp, tp is type(None)
    args = get_args(tp)
    rest = tuple(a for a in args if a is not type(None))
    inner = rest[0] if len(rest) == 1 else Union[rest]  # noqa: UP007 (built from a tuple)
    return inner, len(rest) < len(args)


def _section_type(tp: Any) -> type | None:
    """The dataclass a field holds when it is a nested section (``X`` or ``X | None``)."""
    inner, _ = _strip_optional(tp)
    return inner if _is_dataclass_type(inner) else None


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except NameError as e:
        raise TypeError(f"cannot resolve the type annotations of {cls.__qualname__}: {e}") from e


def _init_fields(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.init]


def type_name(tp: Any) -> str:
    """A readable name for an annotation: ``int | None``, ``tuple[str, ...]``, ``{a, b}`` for a Literal."""
    if tp is Any:
        return "any"
    if tp is type(None):
        return "None"
    if _is_union(tp):
        return " | ".join(type_name(a) for a in get_args(tp))
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return "{" + ", ".join(str(a) for a in args) + "}"
    if origin is not None and args:
        inner = ", ".join("..." if a is Ellipsis else type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    return getattr(tp, "__name__", str(tp))


def _own_field_docs(klass: type) -> dict[str, str]:
    """Docstrings of the fields defined in ``klass`` itself (not its bases)."""
    try:
        source = textwrap.dedent(inspect.getsource(klass))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return {}  # no source (REPL, frozen app): fields simply go undocumented
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)
    if node is None:
        return {}
    docs = {}
    for stmt, after in zip(node.body, node.body[1:]):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(after, ast.Expr) \
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
            docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs


def field_docs(cls: type) -> dict[str, str]:
    """Every documented field of dataclass ``cls`` -> its docstring, inherited ones included (a subclass's wins),
    nested sections' fields as ``section.field``."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_field_docs(klass))
    names = {f.name for f in dataclasses.fields(cls)}
    docs = {k: v for k, v in docs.items() if k in names}
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        section = _section_type(hints[f.name])
        if section is not None:
            docs.update({f"{f.name}.{k}": v for k, v in field_docs(section).items()})
    return docs


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    """Every settable dotted key of ``cls``: sections and their fields."""
    hints, keys = _hints(cls), []
    for f in _init_fields(cls):
        key = prefix + f.name
        keys.append(key)
        section = _section_type(hints[f.name])
        if section is not None:
            keys.extend(_all_keys(section, key + "."))
    return keys


def _closest(key: str, candidates: Sequence[str], n: int = 3) -> list[str]:
    """Candidates most like ``key``, by whole dotted path and by last part (a field in the wrong section)."""
    prefix, _, leaf = key.rpartition(".")

    def initials(name: str) -> str:
        return "".join(part[:1] for part in name.split("_")) if "_" in name else ""

    def score(cand: str) -> float:
        cand_prefix, _, cand_leaf = cand.rpartition(".")
        if initials(leaf) == cand_leaf or initials(cand_leaf) == leaf:
            return 0.9  # learning_rate -> lr, mnt -> max_new_tokens
        last = difflib.SequenceMatcher(None, leaf, cand_leaf).ratio()
        if cand_prefix == prefix:  # same section: the shared prefix says nothing about similarity
            return last
        return max(difflib.SequenceMatcher(None, key, cand).ratio(), 0.95 * last)

    scored = sorted(((score(c), c) for c in candidates if c != key), key=lambda sc: (-sc[0], sc[1]))
    return [c for s, c in scored[:n] if s >= 0.6]


def renamed_keys(cls: type) -> dict[str, tuple[str, Any]]:
    """``old -> (new, convert)`` from the class's ``RENAMED`` (``old -> new`` or ``old -> (new, convert)``,
    ``convert(value, data)`` giving the new value from the old and the section's other values)."""
    out = {}
    for old, target in getattr(cls, "RENAMED", {}).items():
        out[old] = target if isinstance(target, tuple) else (target, None)
    return out


def apply_renames(cls: type, data: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``data`` with every old key of ``cls`` renamed (and converted), each with a warning naming both."""
    out = dict(data)
    for old, (new, convert) in renamed_keys(cls).items():
        if old not in out:
            continue
        value = out.pop(old)
        out[new] = value if convert is None else convert(value, out)
        prefix = f"{where}." if where else ""
        warnings.warn(f"config key {prefix + old!r} is now {prefix + new!r}; the old name is accepted until the next "
                      "release", FutureWarning, stacklevel=2)
    return out


def refuse_retired(cls: type, keys: Iterable[str], where: str = "", dash: str = "") -> None:
    """Raise :class:`ConfigError` for the first of ``keys`` (of section ``where``) in ``cls.RETIRED``."""
    retired = getattr(cls, "RETIRED", {})
    for key in keys:
        if key in retired:
            raise ConfigError(retired_message(dash + (f"{where}.{key}" if where else key), retired[key]))


def without_retired(cls: type, data: Mapping, source: str) -> dict:
    """``data`` (a config file grouprl wrote, ``source``) less the keys ``cls`` retired since, each named in a
    warning: an earlier release's run folder is still evaluated, while a user's config is refused."""
    retired = getattr(cls, "RETIRED", {})
    dropped = [k for k in data if k in retired]
    if dropped:
        instead = "; ".join(retired[k] for k in dropped)
        warnings.warn(f"{source}: ignoring retired keys {', '.join(dropped)} ({instead})", stacklevel=2)
    return {k: v for k, v in data.items() if k not in retired}


def _unknown_keys_error(root: type, bad: list[str], section: type, where: str, dash: str) -> ConfigError:
    """One paragraph for keys that ``section`` (at ``where``) lacks, suggesting keys of ``root``."""
    candidates = _all_keys(root, f"{where}." if root is section and where else "")
    parts, suggested = [], False
    for key in bad:
        close = _closest(key, candidates)
        suggested |= bool(close)
        hint = f" (did you mean {' or '.join(repr(dash + c) for c in close)}?)" if close else ""
        parts.append(f"{dash + key!r}{hint}")
    noun = "key" if len(bad) == 1 else "keys"
    kind = ("option" if len(bad) == 1 else "options") if dash else f"config {noun}"
    names = [f.name for f in _init_fields(section)]
    if suggested and len(names) > 12:  # a suggestion beats a wall of names; --help has them all
        return ConfigError(f"Unknown {kind} {', '.join(parts)}. See --help for every key.")
    scope = f"in section {where!r}" if where else "at the top level"
    return ConfigError(f"Unknown {kind} {', '.join(parts)}. Valid keys {scope}: {', '.join(names)}.")
