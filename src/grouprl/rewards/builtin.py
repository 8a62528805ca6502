"""Built-in reward functions, and a registry of them by name.

Each follows the protocol of :mod:`grouprl.rewards.base`. Functions that need options (a regex,
a target length) are made by a factory; ``make_reward(name, **options)`` builds any of them from
a config. Lengths are counted in generated tokens: ``len(completion_ids[i])``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from grouprl.registry import Registry

RewardList = list[float | None]

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
# A number: optional sign (not when the '-' is a binary minus right after a digit or a bracket),
# thousands separators only in groups of three, optional decimals or a simple fraction.
NUMBER = re.compile(r"(?:(?<![\w)\]])-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+|/\d+)?")
THINK_ANSWER_FORMAT = r"<think>.*?</think>\s*<answer>.*?</answer>"


def _last_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}``, braces matched (``\boxed{\frac{1}{2}}`` works)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None


def extract_answer(text: str) -> str | None:
    r"""The final answer a completion gives: the last ``<answer>...</answer>``, else the last
    ``\boxed{...}``, else the last number; None if there is none of these.

    >>> extract_answer("3 + 4 = 7, so the answer is 7.")
    '7'
    >>> extract_answer("<answer> 12 </answer> then rambling 99")
    '12'
    >>> extract_answer(r"so $\boxed{\frac{1}{2}}$") , extract_answer("no digits")
    ('\\frac{1}{2}', None)
    """
    tags = ANSWER_TAG.findall(text)
    if tags:
        return tags[-1].strip()
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    numbers = NUMBER.findall(text)
    return numbers[-1] if numbers else None


def parse_number(text: str) -> Fraction | None:
    """``text`` as an exact number if it is one ("1,024", "-3.50", "7/2", "$12."), else None.

    >>> parse_number("1,024"), parse_number("-3.50"), parse_number("seven")
    (Fraction(1024, 1), Fraction(-7, 2), None)
    """
    cleaned = text.strip().strip("$").rstrip(".").replace(",", "").strip()
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(extracted: str | None, gold: Any) -> bool:
    """Whether an extracted answer equals the gold one: numerically when the gold answer is a
    number (the last number inside the extracted text counts, so "<answer>x = 5</answer>" matches
    5), else as case- and whitespace-insensitive text.

    >>> answers_match("x = 5", 5), answers_match("5.0", "5"), answers_match(" Paris ", "paris")
    (True, True, True)
    """
    if extracted is None:
        return False
    gold_number = parse_number(str(gold))
    if gold_number is not None:
        numbers = NUMBER.findall(extracted)
        return bool(numbers) and parse_number(numbers[-1]) == gold_number
    return " ".join(extracted.split()).casefold() == " ".join(str(gold).split()).casefold()


def exact_match(prompts: list[Any], completions: list[str], *, answer: list[Any]) -> RewardList:
    """1.0 where the completion's final answer (:func:`extract_answer`) equals the ``answer``
    column (:func:`answers_match`), else 0.0; None where the row has no answer.

    >>> exact_match(["2+2?"] * 3, ["It is 4.", "<answer>5</answer>", "four"], answer=[4, 4, None])
    [1.0, 0.0, None]
    """
    return [None if gold is None else float(answers_match(extract_answer(c), gold))
            for c, gold in zip(completions, answer)]


def math_equivalence(prompts: list[Any], completions: list[str], *, answer: list[Any]) -> RewardList:
    r"""1.0 where ``math-verify`` finds the completion's answer mathematically equal to the
    ``answer`` column (LaTeX, fractions, sets, intervals ...), else 0.0; None where there is no answer.

    math-verify's own timeouts use SIGALRM, which works only in the main thread; elsewhere they
    are switched off.

    >>> math_equivalence(["?"] * 3, [r"$\boxed{\frac{1}{2}}$", r"$\boxed{0.5}$", r"$\boxed{\{1,2\}}$"],
    ...                  answer=["1/2", r"$\frac{2}{4}$", r"$\{2,1\}$"])
    [1.0, 1.0, 1.0]
    """
    from math_verify import parse, verify

    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    scores: RewardList = []
    for completion, gold in zip(completions, answer):
        if gold is None:
            scores.append(None)
            continue
        gold_text = str(gold)
        gold_parsed = parse(gold_text, parsing_timeout=timeout) or parse(f"${gold_text}$", parsing_timeout=timeout)
        pred = parse(completion, parsing_timeout=timeout)
        ok = bool(gold_parsed and pred) and verify(gold_parsed, pred, timeout_seconds=timeout)
        scores.append(float(ok))
    return scores


def format_reward(pattern: str = THINK_ANSWER_FORMAT, name: str = "format") -> Callable[..., RewardList]:
    r"""A reward of 1.0 where the whole completion (stripped) matches ``pattern`` (``.`` matches
    newlines), else 0.0. The default asks for ``<think>...</think>`` then ``<answer>...</answer>``.

    >>> fmt = format_reward()
    >>> fmt([None] * 2, ["<think>2+2</think>\n<answer>4</answer>", "4"])
    [1.0, 0.0]
    """
    compiled = re.compile(pattern, re.DOTALL)

    def reward(prompts: list[Any], completions: list[str]) -> RewardList:
        return [float(compiled.fullmatch(c.strip()) is not None) for c in completions]

    reward.__name__ = name
    return reward


def _lengths(completion_ids: list[list[int]] | None, who: str) -> list[int]:
    if completion_ids is None:
        raise ValueError(f"{who} counts generated tokens and needs completion_ids")
    return [len(ids) for ids in completion_ids]


def length_target(target: int, name: str = "length_target") -> Callable[..., RewardList]:
    """A reward of 1 at exactly ``target`` tokens, falling linearly to 0 at 0 and 2 * target
    tokens (and staying 0 beyond): ``max(0, 1 - |L - target| / target)``.

    >>> near_10 = length_target(10)
    >>> near_10([None] * 4, [""] * 4, completion_ids=[[0] * 10, [0] * 5, [0] * 13, [0] * 25])
    [1.0, 0.5, 0.7, 0.0]
    """
    if target <= 0:
        raise ValueError(f"length_target: target must be > 0 tokens, got {target}")

    def reward(prompts: list[Any], completions: list[str], *, completion_ids: list[list[int]]) -> RewardList:
        return [max(0.0, 1.0 - abs(n - target) / target) for n in _lengths(completion_ids, name)]

    reward.__name__ = name
    return reward


def overlong_penalty(max_length: int, cache_length: int, name: str = "overlong_penalty") -> Callable[..., RewardList]:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), added to the task reward:
    0 up to ``max_length - cache_length`` tokens, then falling linearly to -1 at ``max_length``,
    and -1 beyond. It tells the policy that a long answer costs, before truncation cuts it.

    With max_length=20, cache_length=8 the soft zone is 12..20 tokens: 16 tokens -> (12-16)/8 = -0.5.

    >>> pen = overlong_penalty(max_length=20, cache_length=8)
    >>> pen([None] * 4, [""] * 4, completion_ids=[[0] * 12, [0] * 16, [0] * 20, [0] * 25])
    [0.0, -0.5, -1.0, -1.0]
    """
    if not 0 < cache_length <= max_length:
        raise ValueError(f"overlong_penalty needs 0 < cache_length <= max_length, got {cache_length}, {max_length}")
    free = max_length - cache_length

    def reward(prompts: list[Any], completions: list[str], *, completion_ids: list[list[int]]) -> RewardList:
        return [0.0 if n <= free else max(-1.0, (free - n) / cache_length) for n in _lengths(completion_ids, name)]

    reward.__name__ = name
    return reward


def repetition_penalty(n: int = 3, max_penalty: float = -1.0,
                       name: str = "repetition_penalty") -> Callable[..., RewardList]:
    """``max_penalty * (1 - distinct / total)`` over the word ``n``-grams of each completion
    (0 for a completion with fewer than ``n`` words): a text that loops earns close to max_penalty.

    "a b a b a b" has the 2-grams ab ba ab ba ab: 2 distinct of 5, so -1 * (1 - 2/5) = -0.6.

    >>> rep = repetition_penalty(n=2)
    >>> rep([None] * 3, ["a b a b a b", "one two three", "hi"])
    [-0.6, 0.0, 0.0]
    """
    if n < 1 or max_penalty > 0:
        raise ValueError(f"repetition_penalty needs n >= 1 and max_penalty <= 0, got n={n}, {max_penalty}")

    def penalty(text: str) -> float:
        words = text.lower().split()
        grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
        return max_penalty * (1.0 - len(set(grams)) / len(grams)) if grams else 0.0

    def reward(prompts: list[Any], completions: list[str]) -> RewardList:
        return [round(penalty(c), 12) + 0.0 for c in completions]  # round: 1 - 2/5 is 0.6000000000000001

    reward.__name__ = name
    return reward


REWARDS: Registry[Callable[..., Callable[..., RewardList]]] = Registry("reward function")
"""name -> factory(**options) -> reward function."""
REWARDS.register("exact_match", lambda: exact_match)
REWARDS.register("math_equivalence", lambda: math_equivalence)
REWARDS.register("format", format_reward)
REWARDS.register("length_target", length_target)
REWARDS.register("overlong_penalty", overlong_penalty)
REWARDS.register("repetition_penalty", repetition_penalty)


def make_reward(name: str, **options: Any) -> Callable[..., RewardList]:
    """The built-in reward function ``name`` configured with ``options``.

    >>> make_reward("length_target", target=8).__name__
    'length_target'
    """
    factory = REWARDS.get(name)
    try:
        return factory(**options)
    except TypeError as e:
        raise TypeError(f"bad options {sorted(options)} for reward function {name!r}: {e}") from None
