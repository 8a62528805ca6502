"""Reading a number out of a policy's turn, the way the built-in environments do."""

from __future__ import annotations

import re

BOXED = re.compile(r"\\boxed\{\s*(-?\d+)\s*\}")
INTEGER = re.compile(r"-?\d+")
_MINUS = str.maketrans({"\u2212": "-", "\uff0d": "-"})  # a typographic minus must not lose the sign
MAX_DIGITS = 4000  # Python refuses to read integers past 4300 digits; no environment's answer is that long


def last_integer(text: str) -> int | None:
    """The answer in ``text``: the last ``\\boxed{n}`` if any, else the last integer; None if there
    is none or it has more than MAX_DIGITS digits.

    >>> last_integer("maybe 3, no: 42."), last_integer("\\\\boxed{7} then 9"), last_integer("none")
    (42, 7, None)
    >>> last_integer("it is \u22125"), last_integer("1,024"), last_integer("9" * 5000)
    (-5, 1024, None)
    """
    text = text.translate(_MINUS)
    found = BOXED.findall(text) or INTEGER.findall(text.replace(",", ""))
    return int(found[-1]) if found and len(found[-1]) <= MAX_DIGITS else None
