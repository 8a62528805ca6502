"""Command-line overrides (``--key value``, ``--section.key value``), ``--help`` from the field docstrings, and
resolution: defaults < YAML file < overrides."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any, NamedTuple

from grouprl.config.convert import _convert, from_dict, read_yaml_mapping, to_dict
from grouprl.config.fields import (
    ConfigError,
    _hints,
    _init_fields,
    _section_type,
    _strip_optional,
    _unknown_keys_error,
    field_docs,
    refuse_retired,
    renamed_keys,
    type_name,
)
from grouprl.config.sections import section_order
from grouprl.registry import import_object
from grouprl.run.files import as_plain


def _lookup(cls: type, key: str) -> Any:
    """Annotation of dotted ``key`` in ``cls``; ConfigError with suggestions if there is none."""
    section, where, tp = cls, "", None
    for part in key.split("."):
        if section is None:
            raise ConfigError(f"Option '--{key}' is invalid: {where!r} is not a section, it has no field {part!r}.")
        refuse_retired(section, [part], where, "--")
        names = {f.name for f in _init_fields(section)}
        renamed = renamed_keys(section)
        if part not in names and part not in renamed:
            raise _unknown_keys_error(cls, [f"{where}.{part}" if where else part], section, where, "--")
        tp = _hints(section)[renamed[part][0] if part in renamed else part]
        where = f"{where}.{part}" if where else part
        section = _section_type(tp)
    return tp


def _is_bool(tp: Any) -> bool:
    return _strip_optional(tp)[0] is bool


def _resolve_option(cls: type, name: str) -> tuple[str, Any, bool]:
    """(dotted key, annotation, negated) for an option name; ``--no-x``, ``--no-s.x``, ``--s.no-x`` negate bool x."""
    key = name.replace("-", "_")
    try:
        return key, _lookup(cls, key), False
    except ConfigError as unknown:
        parts = key.split(".")
        candidates = [key[3:]] if key.startswith("no_") else []
        if parts[-1].startswith("no_"):
            candidates.append(".".join([*parts[:-1], parts[-1][3:]]))
        refuse_retired(cls, [c for c in candidates if "." not in c], dash="--")
        for candidate in candidates:
            try:
                tp = _lookup(cls, candidate)
            except ConfigError:
                continue
            if _is_bool(tp):
                return candidate, tp, True
        raise ConfigError(str(unknown).replace(f"'--{key}'", f"'--{name}'", 1)) from None  # echo it as typed


def parse_overrides(args: Sequence[str], cls: type) -> list[tuple[str, Any]]:
    """Command-line tokens -> [(dotted key, converted value)], in order: ``--key value``, ``--key=value``,
    ``--section.key value`` (dashes for underscores); a bool also ``--flag``, ``--no-flag``, ``--flag false``;
    ``none`` empties an Optional field; lists are ``a,b,c`` or ``[a, b]``.
    """
    out, i = [], 0
    while i < len(args):
        token = str(args[i])
        i += 1
        if not token.startswith("--") or token == "--":
            raise ConfigError(
                f"Unexpected command-line argument {token!r}: options look like --key value or --key=value, and a "
                "list is one argument, a,b,c or '[a, b]' (quoted), not values separated by spaces."
            )
        name, eq, raw = token[2:].partition("=")
        key, tp, negated = _resolve_option(cls, name)
        section = _section_type(tp)
        if section is not None:
            example = f"--{key}.{_init_fields(section)[0].name}" if _init_fields(section) else f"--{key}.FIELD"
            raise ConfigError(f"'--{key}' is a section; set its fields one by one, e.g. '{example}'.")
        if negated:
            if eq:
                raise ConfigError(f"'--{name}' takes no value; use '--{key}={raw}' instead.")
            value: Any = False
        elif eq:
            value = raw
        elif i < len(args) and not str(args[i]).startswith("--"):  # "--bf16 false" as well as "--lr 1e-5"
            value = args[i]
            i += 1
        elif _is_bool(tp):
            value = True  # a bare flag
        else:
            raise ConfigError(f"Option '--{key}' needs a value ({type_name(tp)}).")
        out.append((key, _convert(value, tp, f"--{key}")))
    return out


def _set_path(data: dict[str, Any], key: str, value: Any) -> None:
    node = data
    *sections, leaf = key.split(".")
    for part in sections:
        if not isinstance(node.get(part), Mapping):
            node[part] = {}  # absent, or an optional section that was None: start from defaults
        node[part] = dict(node[part])  # copy, so the caller's nested dicts are never mutated
        node = node[part]
    node[leaf] = as_plain(value)


def apply_overrides(config: Any, args: Sequence[str], cls: type | None = None) -> Any:
    """Command-line overrides applied to a dataclass instance, or to a YAML dict (then ``cls`` names its keys)."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        cls = type(config)
        data = to_dict(config)
    elif isinstance(config, Mapping):
        if cls is None:
            raise TypeError("apply_overrides on a dict needs cls, the dataclass that defines the keys")
        data = dict(config)
    else:
        raise TypeError(f"apply_overrides needs a dataclass instance or a dict, got {config!r}")
    for key, value in parse_overrides(args, cls):
        _set_path(data, key, value)
    return data if isinstance(config, Mapping) else from_dict(cls, data)


class FieldInfo(NamedTuple):
    """One row of the config reference; ``default`` is text (or ``required``), ``section`` "" at the top level."""

    key: str
    type: str
    default: str
    doc: str
    section: str
    is_section: bool
    annotation: Any = None


def format_value(value: Any) -> str:
    """A default as a user writes it in YAML or on the command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "None"
    if isinstance(value, str):
        return value if value and value.strip() == value and "," not in value else repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return repr(value)


def _default_of(f: dataclasses.Field, parent_default: Any) -> Any:
    if parent_default is not None:  # a section built by its parent's factory may differ from its class defaults
        return getattr(parent_default, f.name)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def built_in_names(registry_path: str) -> str:
    """``Built-in names: a, b.`` of the registry at ``registry_path`` (``module:NAME``), never a stale copy."""
    return f"Built-in names: {', '.join(import_object(registry_path, 'registry').names())}."


def describe_fields(cls: type, _prefix: str = "", _default: Any = None) -> list[FieldInfo]:
    """Every field of ``cls`` in definition order, nested sections' fields after them; a field in the class's
    ``BUILT_IN`` map (field -> registry path) gets the registry's names appended to its doc."""
    docs, hints, rows = field_docs(cls), _hints(cls), []
    for f in _init_fields(cls):
        key, tp = _prefix + f.name, hints[f.name]
        default = _default_of(f, _default)
        section = _section_type(tp)
        text = "required" if default is dataclasses.MISSING else format_value(default)
        section_name = _prefix[:-1]
        doc = docs.get(f.name, "")
        if f.name in getattr(cls, "BUILT_IN", {}):
            doc = f"{doc} {built_in_names(cls.BUILT_IN[f.name])}".strip()
        rows.append(FieldInfo(key, type_name(tp), "" if section else text, doc, section_name, section is not None, tp))
        if section is not None:
            nested_default = default if dataclasses.is_dataclass(default) else None
            rows.extend(describe_fields(section, key + ".", nested_default))
    return rows


class _CollectOverride(argparse.Action):
    """Record ``--key=value`` text in order for parse_overrides, so argparse and YAML share its rules."""

    def __init__(self, option_strings: list[str], dest: str, key: str, field: FieldInfo | None = None, **kwargs: Any):
        self.key = key
        self.field = field  # the key's row, for the sectioned --help (grouprl.cli.help)
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        value = self.const if values is None or values == [] else values
        collected = list(getattr(namespace, self.dest, None) or [])  # copy: defaults are shared objects
        collected.append(f"--{self.key}={value}")
        setattr(namespace, self.dest, collected)


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls: type, dest: str = "overrides",
                            keys: Collection[str] | None = None, aliases: Mapping[str, str] | None = None,
                            title: str = "config options (YAML keys; the command line wins)",
                            sections: Mapping[str, str] | None = None,
                            notes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Add one ``--key`` option per field of ``cls``; values land as ``--key=value`` strings in ``namespace.<dest>``
    for :func:`load_config`. Parse with ``parse_known_args`` and pass the leftovers on too (a misspelt option gets
    the did-you-mean). ``keys`` limits the options shown; ``aliases`` maps extra names to keys; top-level fields go
    in group ``title``, or one per section of ``sections`` under its line from ``notes``. The groups by title."""
    parser.set_defaults(**{dest: []})
    alias_of = {key: name for name, key in (aliases or {}).items()}
    groups: dict[str, Any] = {}

    def group(name: str, description: str | None = None) -> Any:
        if name not in groups:
            groups[name] = parser.add_argument_group(name, description.replace("%", "%%") if description else None)
        return groups[name]

    rows = describe_fields(cls)
    top = {r.key: r for r in rows if not r.section and not r.is_section}
    ordered = [(title, list(top))] if sections is None else section_order(list(top), dict(sections))
    for section, names in ordered:
        for name in names:
            if keys is None or name in keys or name in alias_of:
                _add_option(group(section, (notes or {}).get(section)), top[name], dest, keys, alias_of)
    for row in rows:
        if row.is_section:
            continue  # its group is made with its first shown field, titled by the section's key
        if row.section and (keys is None or row.key in keys or row.key in alias_of):
            doc = next((r.doc for r in rows if r.is_section and r.key == row.section), "")
            _add_option(group(f"section {row.section}", doc or None), row, dest, keys, alias_of)
    return groups


def _add_option(group: Any, row: FieldInfo, dest: str, keys: Collection[str] | None,
                alias_of: Mapping[str, str]) -> None:
    """The ``--key`` option (and a bool's hidden ``--no-key``) of one field, in ``group``."""
    doc = row.doc.replace("%", "%%")  # argparse %-formats help strings
    help_text = f"{doc} [{row.type}; default: {row.default.replace('%', '%%')}]".strip()
    names = [f"--{row.key}"] + ([f"--{alias_of[row.key]}"] if row.key in alias_of else [])
    if keys is not None and row.key not in keys:
        names = names[1:]  # only the alias is shown; the key itself still works as a leftover
    if _is_bool(row.annotation):
        group.add_argument(*names, nargs="?", const="true", metavar="BOOL", action=_CollectOverride,
                           dest=dest, key=row.key, field=row, help=help_text)
        group.add_argument(f"--no-{row.key}", nargs=0, const="false", action=_CollectOverride,
                           dest=dest, key=row.key, help=argparse.SUPPRESS)
    else:
        metavar = row.type.replace(" ", "")
        group.add_argument(*names, metavar=metavar, action=_CollectOverride, dest=dest,
                           key=row.key, field=row, help=help_text)


def load_config(cls: type, path: str | os.PathLike | None = None, overrides: Sequence[str] = ()) -> Any:
    """Resolve a config: dataclass defaults < YAML file ``path`` < command-line ``overrides``."""
    data = read_yaml_mapping(path) if path is not None else {}
    data = apply_overrides(data, overrides, cls)
    try:
        return from_dict(cls, data)
    except ConfigError as e:
        if path is None:
            raise
        if overrides and _file_alone_is_fine_or_other(cls, path, str(e)):  # the command line's value is at fault
            raise ConfigError(f"On the command line (over {path}): {e}") from None
        raise ConfigError(f"In {path}: {e}") from None


def _file_alone_is_fine_or_other(cls: type, path: str | os.PathLike, message: str) -> bool:
    try:
        from_dict(cls, read_yaml_mapping(path))
    except ConfigError as e:
        return str(e) != message
    return True


def load_yaml(path: str | os.PathLike, cls: type) -> Any:
    """Dataclass ``cls`` from a YAML file; errors name the file and the key."""
    return load_config(cls, path)
