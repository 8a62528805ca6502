"""Built-in reward functions (:mod:`grouprl.rewards.base`'s protocol), made by factories; lengths in tokens."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from grouprl.registry import Registry
from grouprl.rewards.answers import answers_correct, completion_answer, gold_answer, same_answer

RewardList = list[float | None]

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
THINK_ANSWER_FORMAT = r"<think>.*?</think>\s*<answer>.*?</answer>"


def extract_answer(text: str) -> str | None:
    """:func:`grouprl.rewards.answers.completion_answer`.

    >>> extract_answer("3 + 4 = 7, so the answer is 7."), extract_answer("no digits")
    ('7', None)
    """
    return completion_answer(text)


def answers_match(extracted: str | None, gold: Any) -> bool:
    r"""Whether an extracted answer equals a gold value (read by ``gold_answer``), without symbolic algebra.

    >>> answers_match("x = 5", 5), answers_match("5.0", "5"), answers_match(" Paris ", "paris")
    (True, True, True)
    >>> answers_match("72", "She has 72 now.\n#### 72"), answers_match("1/2", "0.5")
    (True, True)
    """
    return same_answer(extracted, gold_answer(gold), symbolic=False)


def exact_match(prompts: list[Any], completions: list[str], *, answer: list[Any]) -> RewardList:
    r"""1.0 where :func:`answers_match` holds for the completion's answer and ``answer``, else 0.0 (None: no gold).

    >>> exact_match(["2+2?"] * 4, ["It is 4.", "<answer>5</answer>", "four", "#### 4"],
    ...             answer=[4, 4, None, "2+2\n#### 4"])
    [1.0, 0.0, None, 1.0]
    """
    return [None if gold is None else float(answers_match(extract_answer(c), gold))
            for c, gold in zip(completions, answer)]


def math_equivalence(prompts: list[Any], completions: list[str], *, answer: list[Any]) -> RewardList:
    r""":func:`exact_match` with math-verify's symbolic equivalence as the last resort; also ``accuracy``.

    >>> math_equivalence(["?"] * 4,
    ...                  [r"$\boxed{\frac{1}{2}}$", r"$\boxed{0.5}$", r"$\boxed{\{1,2\}}$", "<answer>72</answer>"],
    ...                  answer=["1/2", r"$\frac{2}{4}$", r"$\{2,1\}$", "48 + 24 = 72\n#### 72"])
    [1.0, 1.0, 1.0, 1.0]
    """
    rows = [i for i, gold in enumerate(answer) if gold is not None]
    right = iter(answers_correct([completions[i] for i in rows], [answer[i] for i in rows]))
    return [None if gold is None else float(next(right)) for gold in answer]


def format_reward(pattern: str = THINK_ANSWER_FORMAT, name: str = "format") -> Callable[..., RewardList]:
    r"""1.0 where the whole stripped completion matches ``pattern`` (``.`` matches newlines), else 0.0.

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
    """``max(0, 1 - |L - target| / target)`` for a completion of L tokens.

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
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13): 0 up to ``max_length - cache_length`` tokens,
    then linear to -1 at ``max_length``, -1 beyond.

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
    """``max_penalty * (1 - distinct / total)`` over each completion's word ``n``-grams (0 under ``n`` words).

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


REWARDS: Registry[Callable[..., Callable[..., RewardList]]] = Registry("reward function")  # name -> factory(**options)
REWARDS.register("exact_match", lambda: exact_match)
REWARDS.register("math_equivalence", lambda: math_equivalence)
REWARDS.register("accuracy", lambda: math_equivalence)
REWARDS.register("format", format_reward)
REWARDS.register("length_target", length_target)
REWARDS.register("overlong_penalty", overlong_penalty)
REWARDS.register("repetition_penalty", repetition_penalty)


def make_reward(name: str, **options: Any) -> Callable[..., RewardList]:
    """The built-in reward function ``name`` configured with ``options``."""
    factory = REWARDS.get(name)
    try:
        return factory(**options)
    except TypeError as e:
        raise TypeError(f"bad options {sorted(options)} for reward function {name!r}: {e}") from None
