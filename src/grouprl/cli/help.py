"""``--help`` of the commands that take every train key, in three sizes: one screen (a usual run's keys and the
sections), ``--help SECTION`` (by short name, title or one of its keys) and ``--help all``. Options are read back
from the parser, a config key's carrying its :class:`~grouprl.config.FieldInfo`."""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from grouprl.config.sections import USUAL_KEYS, short_name

ALL = "all"
MAX_WIDTH = 100  # widest text, however wide the terminal: longer lines read badly
KEY_COLUMN = 24  # where the first screen's one-line texts start
OPTIONS = "options"  # argparse's title of a command's own options (--config, --debug)
NOT_ON_FIRST_SCREEN = ("help", "debug")  # the command's own options (by dest) left to --help all
_SENTENCE_END = re.compile(r"(?<!\be\.g\.)(?<!\bi\.e\.)(?<! al\.)(?<! vs\.)(?<=[.!?])\s+")  # not an abbreviation's


def summary(doc: str) -> str:
    """The first sentence of a field's documentation (the whole of it when it has one sentence)."""
    flat = " ".join(doc.split())
    return _SENTENCE_END.split(flat, maxsplit=1)[0] if flat else ""


def _width() -> int:
    return max(40, min(shutil.get_terminal_size().columns - 2, MAX_WIDTH))  # argparse's width, capped


def _groups(parser: argparse.ArgumentParser) -> list[tuple[str, str | None, list[argparse.Action]]]:
    """(title, description, shown actions) of each argument group that shows an option."""
    out = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help is not argparse.SUPPRESS]
        if actions:
            out.append((group.title or "", group.description, actions))
    return out


def _invocation(action: argparse.Action) -> str:
    names = ", ".join(action.option_strings)
    if action.nargs == 0:
        return names
    metavar = action.metavar or action.dest.upper()
    return f"{names} [{metavar}]" if action.nargs == "?" else f"{names} {metavar}"


def _field(action: argparse.Action) -> Any:
    return getattr(action, "field", None)


def _full_entry(action: argparse.Action, width: int) -> list[str]:
    """An option in full: ``--key TYPE (default: X)`` and its text, whose further lines are indented under it."""
    row = _field(action)
    if row is None:
        head, text = _invocation(action), action.help or ""
    else:
        head = f"{_invocation(action)} (default: {row.default})"
        text = row.doc
    # the text starts on the option's line and hangs under it, so the full reference stays short
    return textwrap.wrap(" ".join(text.split()), width, initial_indent=f"  {head}  ", subsequent_indent=" " * 6,
                         break_on_hyphens=False) or [f"  {head}"]


def _section(title: str, description: str | None, actions: Sequence[argparse.Action], width: int) -> list[str]:
    lines = ["", f"{title}:"]
    if description:
        lines += textwrap.wrap(" ".join(description.split()), width, initial_indent="  ", subsequent_indent="  ")
    for action in actions:
        lines += _full_entry(action, width)
    return lines


def _wrapped(text: str, width: int) -> list[str]:
    return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False) if text else []


def full_help(parser: argparse.ArgumentParser, which: str) -> str:
    """``--help all`` (every section, the description and example) or ``--help SECTION`` (:func:`find_section`)."""
    width, groups = _width(), _groups(parser)
    if which.strip().lower() == ALL:
        lines = [parser.format_usage().rstrip(), "", *_wrapped(parser.description or "", width)]
        chosen = groups
    else:
        title = find_section(parser, which)
        lines = [parser.format_usage().rstrip()]
        chosen = [g for g in groups if g[0] == title]
    for title, description, actions in chosen:
        lines += _section(title, description, actions, width)
    if which.strip().lower() == ALL and parser.epilog:
        lines += ["", *_wrapped(parser.epilog, width)]
    return "\n".join(lines) + "\n"


EMPTY = frozenset({"None", "[]", "{}", "''"})  # defaults the first screen leaves unsaid


def _one_line(action: argparse.Action, width: int) -> list[str]:
    """An option on the first screen: its name (a config key's without its type) and first sentence."""
    row = _field(action)
    if row is None:
        head, text = f"  {_invocation(action)}", summary(action.help or "")
    else:
        head = "  " + ", ".join(action.option_strings)
        text = summary(row.doc) + ("" if row.default in EMPTY else f" [{row.default}]")
    pad = KEY_COLUMN - len(head)
    first = head + " " * pad if pad > 1 else head + "\n" + " " * KEY_COLUMN
    wrapped = textwrap.wrap(text, max(20, width - KEY_COLUMN), break_on_hyphens=False) or [""]
    return (first + wrapped[0]).split("\n") + [" " * KEY_COLUMN + more for more in wrapped[1:]]


def _section_line(name: str, keys: list[str], width: int) -> str:
    """``  name    key, key, ... (N keys)`` cut to ``width``."""
    suffix = f" ({len(keys)} keys)" if len(keys) > 1 else ""
    head, shown = f"  {name:<14}", []
    for key in keys:
        if len(head) + len(", ".join([*shown, key])) + len(", ...") + len(suffix) > width:
            break
        shown.append(key)
    more = ", ..." if len(shown) < len(keys) else ""
    return head + ", ".join(shown) + more + suffix


def first_screen(parser: argparse.ArgumentParser) -> str:
    """``--help``: the keys of a usual run, one line each, and how to see one section or every key."""
    width, groups = _width(), _groups(parser)
    by_key = {_field(a).key: a for _, _, actions in groups for a in actions if _field(a) is not None}
    own = [a for title, _, actions in groups if title == OPTIONS for a in actions if a.dest not in NOT_ON_FIRST_SCREEN]
    prog = parser.prog
    lines = [parser.format_usage().rstrip(), "", *_wrapped(parser.description or "", width), "",
             "the keys of a usual run [default]:"]
    for key in USUAL_KEYS:
        if key in by_key:
            lines += _one_line(by_key[key], width)
    for action in own:
        lines += _one_line(action, width)
    lines += ["", *_wrapped(f"the sections: {prog} --help NAME shows one (e.g. {prog} --help sampling), "
                            f"{prog} --help {ALL} every key:", width)]
    for title, _, actions in groups:
        keys = [_field(a).key for a in actions if _field(a) is not None]
        if keys:
            lines.append(_section_line(short_name(title), keys, width))
    if parser.epilog:
        lines += ["", *_wrapped(parser.epilog, width)]
    return "\n".join(lines) + "\n"


def find_section(parser: argparse.ArgumentParser, which: str) -> str:
    """The title of the section ``which`` names by short name, title or one of its keys (``lr`` -> optimizer)."""
    sections = {title: [_field(a).key for a in actions if _field(a) is not None]
                for title, _, actions in _groups(parser) if title != OPTIONS}
    wanted = which.strip().lower().lstrip("-").replace("-", "_")
    for title, keys in sections.items():
        if wanted in (short_name(title), title.lower()) or wanted in keys:
            return title
    names = ", ".join(short_name(t) for t in sections)
    raise ValueError(f"no help section {which!r}; sections: {names} (or {ALL}, or a key's name)")


class SectionHelp(argparse.Action):
    """``-h, --help [SECTION]``: print :func:`first_screen`, or :func:`full_help` of ``SECTION``, and exit."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", default=argparse.SUPPRESS, metavar="SECTION",
                         help=f"this screen; --help {ALL}: every key; --help NAME: one section", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any,
                 option_string: str | None = None) -> None:
        try:
            text = first_screen(parser) if values is None else full_help(parser, values)
        except ValueError as e:
            parser.error(str(e))
        sys.stdout.write(text)
        parser.exit()


def add_section_help(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` (made with ``add_help=False``) the sectioned ``-h, --help [SECTION]``."""
    parser.add_argument("-h", "--help", action=SectionHelp)
