"""Reading a number out of a policy's turn, the way the built-in environments do."""

from __future__ import annotations

import re

BOXED = re.compile(r"\\boxed\{\s*(-?\d+)\s*\}")
INTEGER = re.compile(r"-?\d+")


def last_integer(text: str) -> int | None:
    """The answer in ``text``: the last ``\\boxed{n}`` if any, else the last integer.

    >>> last_integer("maybe 3, no: 42."), last_integer("\\\\boxed{7} then 9"), last_integer("none")
    (42, 7, None)
    """
    boxed = BOXED.findall(text)
    if boxed:
        return int(boxed[-1])
    found = INTEGER.findall(text.replace(",", ""))
    return int(found[-1]) if found else None
