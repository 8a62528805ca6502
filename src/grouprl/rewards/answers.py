"""Final answers: read from a completion, read from a dataset's gold value, compared. docs/answers.md states the
reading order, why a hedged answer has none, and the normalisation; symbolic equality is math-verify's, bounded."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

from grouprl.rewards.symbolic import equal_all, tractable

# A number: optional sign (not when the '-' is a binary minus right after a digit or a bracket),
# thousands separators only in groups of three, optional decimals or a simple fraction.
NUMBER = re.compile(r"(?:(?<![\w)\]])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+|/\d+)?")
_TAG = re.compile(r"<(/?)answer>", re.IGNORECASE)
_BOX = re.compile(r"\\boxed\s*\{|\{|\}")
_HASHES = re.compile(r"####[ \t]*([-+$\\.\d€£(][^\n]*)")  # a number follows; "#### Step 1" is a heading
# "The answer is simple: ..." introduces reasoning, not an answer. The answer runs to the end of its
# sentence (". ", "!", "?", ";", a line end, or ", " then a word: "72, since ..."), matched lazily so
# each character is read once, however many phrases a line holds.
_PHRASE = re.compile(r"\banswer\s*(?:is\b\s*:?|:|=)(?![ \t]*(?:simple|easy|clear|straightforward|not|as follows|below|"
                     r"that|this|to|the following|given|shown|found|computed|calculated)\b)[ \t]*"
                     r"([^\n]*?)(?=\.(?:\s|$)|[!?;\n]|,\s+[A-Za-z]|$)", re.IGNORECASE)
_HEDGE = re.compile(r"\b(?:or|maybe|perhaps|possibly|either)\b", re.IGNORECASE)
_BETWEEN_HEDGED = re.compile(r"\s*,?\s*(?:(?:or|maybe|perhaps|possibly)\b\s*)+$", re.IGNORECASE)
_MINUS = str.maketrans({"\u2212": "-", "\uff0d": "-", "\ufe63": "-"})
_WRAPPERS = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
# Words in \text{} after a value are units ("4\pi \text{ cm}^2"); alone they are the answer ("\text{Paris}").
_UNIT_TEXT = re.compile(r"(?<=\S)\s*\\(?:text|mbox|mathrm)\s*\{\s*(?!(?:or|and)\b)[A-Za-z]+\.?\s*\}"
                        r"(?:\^\{?[23]\}?)?\s*$")
_DROPPED = re.compile(r"\\left\b|\\right\b|\\displaystyle\b|\\[!,;: ]|\*\*|`|\\\$|\$|€|£|\\%|%|\^\s*\{?\s*\\circ\s*\}?"
                      r"|\\circ\b|\\degree\b|°|^\\\(|\\\)$|^\\\[|\\\]$")
_ASSIGNMENT = re.compile(r"^(?:[A-Za-z](?:_\{?\w+\}?)?|[\w\s+\-*/().×÷,=]+?)\s*=\s*(?=[^=]+$)")
_PLAIN = re.compile(r"[+-]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,3}(?!\w))?")
_FRACTION = re.compile(r"([+-]?)\\frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}|([+-]?)(\d+)\s*/\s*(\d+)")
# Units glued to a number ("5cm") must be known: a glued letter is more often a variable ("5x").
_GLUED_UNITS = {"cm", "mm", "km", "m", "kg", "g", "mg", "lb", "lbs", "oz", "ft", "mi", "h", "hr", "hrs", "min",
                "s", "sec", "ml", "l", "mph", "st", "nd", "rd", "th"}
# Words after a number that change its value or make it an expression, so never read as units.
_NOT_UNITS = {"pi", "sqrt", "root", "squared", "cubed", "times", "over", "plus", "minus", "divided", "half",
              "halves", "third", "thirds", "quarter", "quarters", "hundred", "hundreds", "thousand", "thousands",
              "million", "millions", "billion", "billions", "dozen", "dozens", "i", "e", "x", "y", "z", "n", "a", "b"}
_LEAD_WORDS = re.compile(r"^(?:(?!(?:" + "|".join(sorted(_NOT_UNITS)) + r")\b)[A-Za-z]+[ \t:]+)+(?=[+-]?\.?\d)",
                         re.IGNORECASE)
MAX_DIGITS = 4000
"""Longest number read exactly (Python refuses to parse integers past 4300 digits)."""
_WORDS = re.compile(r"[A-Za-z][A-Za-z ]*[A-Za-z]")
_AMBIGUOUS = object()


def gold_answer(value: Any) -> str | None:
    r"""The gold answer in a dataset value (tag, ``####``, ``\boxed{}``, else the value as text); None
    when there is none (None, NaN, an empty string, an unclosed box, a container).

    >>> gold_answer("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72"), gold_answer(r"So $\boxed{\frac{1}{2}}$.")
    ('72', '\\frac{1}{2}')
    >>> gold_answer(72), gold_answer(2.50), gold_answer(" Paris "), gold_answer(""), gold_answer(float("nan"))
    ('72', '2.5', 'Paris', None, None)
    """
    if isinstance(value, float):
        return None if not math.isfinite(value) else repr(value)
    if isinstance(value, int | Fraction):
        return str(value)
    if not isinstance(value, str):
        return None
    text = value.translate(_MINUS)
    tags = _tags(text)
    if tags:
        found = tags[-1].strip()
    elif "####" in text:
        found = text.rsplit("####", 1)[1].strip().split("\n", 1)[0].strip()
    elif "\\boxed" in text:
        boxes = _boxes(text)
        found = boxes[-1].strip() if boxes else ""
    else:
        found = text.strip()
    return found or None


def check_golds(values: Iterable[Any]) -> tuple[int, str | None]:
    """How many gold values have no answer, and the first of them (``repr``, 120 characters at most).

    >>> check_golds(["#### 72", 5, None, "So $\\\\boxed{3", "x"])
    (2, 'None')
    """
    bad = [v for v in values if gold_answer(v) is None]
    return len(bad), (repr(bad[0])[:120] if bad else None)


def completion_answer(text: str) -> str | None:
    r"""The final answer after the last ``</think>``, as written; None when there is none or candidates differ.

    >>> completion_answer("3 + 4 = 7"), completion_answer("<answer> 12 </answer> then rambling 99")
    ('7', '12')
    >>> completion_answer(r"so $\boxed{\frac{1}{2}}$"), completion_answer("The answer is 72 dollars.")
    ('\\frac{1}{2}', '72 dollars')
    >>> completion_answer("<answer>12 or 15</answer>"), completion_answer(r"\boxed{12} or \boxed{15}")
    (None, None)
    >>> completion_answer(r"<think>\boxed{12}? No: \boxed{15}</think> So \boxed{15}.")
    '15'
    """
    end_of_thought = text.lower().rfind("</think>")
    text = text[end_of_thought + len("</think>"):] if end_of_thought >= 0 else text
    text = text.translate(_MINUS)
    for find in (_tags, _boxes, _hashes):
        spans = find(text)
        if spans:
            return _agreed(spans)
    phrases = _phrases(text)
    if phrases:  # "answer:" also heads reasoning steps, and a later "the answer is" corrects an earlier one
        return _agreed(phrases[-1:])
    return _last_number(text)


def same_answer(pred: str | None, gold: str | None, *, symbolic: bool = True) -> bool:
    r"""Same exact number after normalisation, else same text ignoring case and spaces, else (with
    ``symbolic``) math-verify's equivalence.

    >>> same_answer("$1,024.00", "1024"), same_answer("25%", "25"), same_answer("−5", "-5")
    (True, True, True)
    >>> same_answer("0.5", r"\dfrac{1}{2}"), same_answer(r"\frac{2}{4}", "1/2"), same_answer("x^2+1", "1+x^2")
    (True, True, True)
    >>> same_answer("72 dollars", "72"), same_answer("73", "72"), same_answer(None, "72")
    (True, False, False)
    """
    return same_answers([(pred, gold)], symbolic=symbolic)[0]


def same_answers(pairs: list[tuple[str | None, str | None]], *, symbolic: bool = True) -> list[bool]:
    """:func:`same_answer` for each ``(pred, gold)`` pair, the symbolic ones in one math-verify call.

    >>> same_answers([("72", "72"), (r"\\sqrt{12}", r"2\\sqrt{3}"), ("Paris", "Lyon")])
    [True, True, False]
    """
    verdicts = [_plain_verdict(pred, gold) for pred, gold in pairs]
    pending = [i for i, v in enumerate(verdicts) if isinstance(v, tuple)]
    symbolic_verdicts = equal_all([verdicts[i] for i in pending]) if symbolic else [False] * len(pending)
    for i, verdict in zip(pending, symbolic_verdicts):
        verdicts[i] = verdict
    return verdicts


def _plain_verdict(pred: str | None, gold: str | None) -> bool | tuple[str, str]:
    """True or False where numbers or text decide; the normalised pair where only symbolic algebra can."""
    if pred is None or gold is None:
        return False
    p, g = normalise(pred), normalise(gold)
    if not p or not g:
        return False
    p_number, g_number = as_number(p), as_number(g)
    if p_number is not None and g_number is not None:
        return p_number == g_number
    if _text_key(p) == _text_key(g):
        return True
    # Plain words read as math are products of symbols ("sirap" would equal "paris"): text only.
    if _WORDS.fullmatch(p) or _WORDS.fullmatch(g) or not (tractable(p) and tractable(g)):
        return False
    return p, g


def answer_is_correct(completion: str, gold: Any) -> bool:
    r"""``same_answer(completion_answer(completion), gold_answer(gold))``: held-out accuracy's check.

    >>> answer_is_correct("<answer>72</answer>", "She sold 24 more.\n#### 72")
    True
    >>> answer_is_correct(r"The answer is $\boxed{0.5}$", r"Hence $\boxed{\frac12}$."), answer_is_correct("12", None)
    (True, False)
    """
    return same_answer(completion_answer(completion), gold_answer(gold))


def answers_correct(completions: list[str], golds: list[Any]) -> list[bool]:
    """:func:`answer_is_correct` for a batch, its symbolic comparisons made together.

    >>> answers_correct(["<answer>72</answer>", r"\\boxed{0.5}"], ["#### 72", r"$\\boxed{\\frac{1}{3}}$"])
    [True, False]
    """
    return same_answers([(completion_answer(c), gold_answer(g)) for c, g in zip(completions, golds)])


def normalise(answer: str) -> str:
    r"""``answer`` without what does not change its value (docs/answers.md lists it).

    >>> normalise(r"\$1{,}000"), normalise(r"x = \dfrac{1}{2}"), normalise(r"45^\circ"), normalise("3 + 4 = 7.")
    ('1,000', '\\frac{1}{2}', '45', '7')
    """
    text = answer.translate(_MINUS).strip()
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("{,}", ",")
    text = _UNIT_TEXT.sub("", text)
    for _ in range(3):  # nested wrappers: \text{\textbf{5}}
        text = _WRAPPERS.sub(r"\1", text)
    text = _DROPPED.sub("", text).strip().rstrip(".").strip()
    return _ASSIGNMENT.sub("", text).strip()


def as_number(answer: str) -> Fraction | None:
    r"""A normalised answer as an exact number (a number or simple fraction, with only words or units
    around it); None for expressions and for words that change the value ("pi", "million").

    >>> as_number("1,024"), as_number("-3.50"), as_number(r"\frac{6}{4}"), as_number("3 apples"), as_number("2 pi")
    (Fraction(1024, 1), Fraction(-7, 2), Fraction(3, 2), Fraction(3, 1), None)
    """
    text = _LEAD_WORDS.sub("", answer.strip())
    fraction = _FRACTION.fullmatch(text)
    if fraction:
        sign, top, bottom = (fraction.group(1), fraction.group(2), fraction.group(3)) if fraction.group(2) else \
            (fraction.group(4), fraction.group(5), fraction.group(6))
        return None if int(bottom) == 0 else Fraction(int(top), int(bottom)) * (-1 if sign == "-" else 1)
    number = _PLAIN.match(text)
    if number is None or len(number.group()) > MAX_DIGITS:
        return None
    rest = text[number.end():]
    if rest and not _are_units(rest):
        return None
    return Fraction(number.group().replace(",", "").rstrip("."))


def _are_units(rest: str) -> bool:
    words = re.findall(r"[^\s.,]+", rest)
    if not words or not all(re.fullmatch(r"[A-Za-z]+(?:\^\{?[23]\}?|[²³])?", w) for w in words):
        return False
    bare = [re.match(r"[A-Za-z]+", w).group().lower() for w in words]
    if not rest[0].isspace() and bare[0] not in _GLUED_UNITS:
        return False
    return not any(w in _NOT_UNITS for w in bare)


def _text_key(answer: str) -> str:
    return "".join(answer.split()).casefold()


def _key(answer: str) -> Fraction | str:
    """What two candidates must share to count as one answer."""
    norm = normalise(answer)
    number = as_number(norm)
    return number if number is not None else _text_key(norm)


def _tags(text: str) -> list[str]:
    """Contents of the ``<answer>...</answer>`` pairs, an opening tag pairing with the next close."""
    spans, opened = [], None
    for match in _TAG.finditer(text):
        if not match.group(1):
            opened = match.end()
        elif opened is not None:
            spans.append(text[opened:match.start()])
            opened = None
    return spans


def _boxes(text: str) -> list[str]:
    r"""Contents of the outermost ``\boxed{...}``, in one pass: unclosed boxes cannot make it quadratic."""
    spans, stack = [], []
    for match in _BOX.finditer(text):
        token = match.group()
        if token == "}":
            if not stack:
                continue
            start = stack.pop()
            if start is not None and not any(s is not None for s in stack):
                spans.append(text[start:match.start()])
        else:
            stack.append(match.end() if token != "{" else None)
    return spans


def _hashes(text: str) -> list[str]:
    return _HASHES.findall(text)


def _phrases(text: str) -> list[str]:
    return _PHRASE.findall(text)


def _agreed(spans: list[str], depth: int = 0) -> str | None:
    """The one answer several marks of a kind give; None if they disagree or offer alternatives."""
    answers = [_single(s, depth) for s in spans]
    if any(a is _AMBIGUOUS for a in answers):
        return None
    given = [a for a in answers if a]
    if not given or len({_key(a) for a in given}) > 1:
        return None
    return given[-1]


def _single(span: str, depth: int) -> Any:
    r"""The answer in one mark's text: a box or answer phrase inside a tag counts; alternatives
    joined by "or" / "maybe" are _AMBIGUOUS unless they are all the same."""
    span = span.strip()
    for find in (_boxes, _phrases):
        inner = find(span)
        if inner:  # boxes in boxes: a few levels are formatting, a thousand are an attack on the stack
            return (_agreed(inner, depth + 1) if depth < 4 else None) or _AMBIGUOUS
    parts = [p.strip(" \t\n,;:") for p in _HEDGE.split(span)]
    parts = [p for p in parts if p]
    if len(parts) > 1 and len({_key(p) for p in parts}) > 1:
        return _AMBIGUOUS
    return parts[-1] if parts else ""


def _last_number(text: str) -> str | None:
    matches = list(NUMBER.finditer(text))
    if not matches:
        return None
    last = matches[-1]
    if len(matches) > 1:
        before = matches[-2]
        if _BETWEEN_HEDGED.fullmatch(text[before.end():last.start()]) and _key(before.group()) != _key(last.group()):
            return None
    return last.group()
