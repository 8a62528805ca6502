"""The ``countdown`` task (TinyZero's): reach a target from given numbers with + - * / and parentheses, each used
at most once; every problem is solvable. The checker reads the last ``<answer>`` tag or else the last line and
evaluates any arithmetic stretch of it exactly, executing nothing."""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from grouprl.rewards.builtin import ANSWER_TAG, RewardList, format_reward
from grouprl.tasks.base import ExpressionError, Task, evaluate_expression

PROMPT = (
    "Using the numbers {numbers}, write an arithmetic expression that equals {target}. You may use "
    "+, -, * and / and parentheses, and each number at most once. Put the expression inside "
    "<answer></answer>, for example <answer>(1 + 2) * 3</answer>."
)
_SYMBOLS = {"×": "*", "\\times": "*", "·": "*", "÷": "/", "\\div": "/", "−": "-"}
MAX_DRAWS = 1000
EXPRESSION_RUN = re.compile(r"[\d\s+\-*/().]*\d[\d\s+\-*/().]*")


def candidate_expression(completion: str) -> str | None:
    """The last answer tag's content, else the last non-empty line; unicode operators mapped."""
    tags = ANSWER_TAG.findall(completion)
    lines = [line for line in completion.strip().splitlines() if line.strip()]
    text = tags[-1] if tags else (lines[-1] if lines else None)
    if text is None:
        return None
    for symbol, op in _SYMBOLS.items():
        text = text.replace(symbol, op)
    return text.strip().strip("$").rstrip(".").strip()


def check_solution(completion: str, numbers: list[int], target: int) -> bool:
    """Whether the completion's expression equals ``target`` using each of ``numbers`` at most once.

    >>> check_solution("<answer>(25 - 5) * 3</answer>", [3, 5, 25], 60)
    True
    >>> check_solution("<answer>25 + 25 + 5 + 5</answer>", [3, 5, 25], 60)  # 25 and 5 used twice
    False
    >>> check_solution("I think 5 * (25 - 13) = 60", [5, 13, 25], 60)
    True
    """
    text = candidate_expression(completion)
    if not text:
        return False
    available = Counter(numbers)
    for run in EXPRESSION_RUN.findall(text):  # stretches of digits and operators, between words or '='
        try:
            value, used = evaluate_expression(run.strip().rstrip("."))
        except ExpressionError:
            continue
        if value == target and not Counter(used) - available:
            return True
    return False


def countdown_correct(prompts: list[Any], completions: list[str], *, numbers: list[list[int]],
                      answer: list[int]) -> RewardList:
    """1.0 where the completion reaches the row's target (``answer``) from its ``numbers``, else 0.0."""
    return [float(check_solution(c, nums, target)) for c, nums, target in zip(completions, numbers, answer)]


def _random_expression(rng: random.Random, values: list[int]) -> tuple[str, Fraction] | None:
    """``values`` combined in random pairs with random operators, or None if a division is inexact or by zero."""
    pool: list[tuple[str, Fraction]] = [(str(v), Fraction(v)) for v in values]
    while len(pool) > 1:
        (ta, a), (tb, b) = pool.pop(rng.randrange(len(pool))), pool.pop(rng.randrange(len(pool)))
        op = rng.choice("+-*/")
        if op == "/" and (b == 0 or (a / b).denominator != 1):
            return None
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else a}[op]
        pool.append((f"({ta} {op} {tb})", value))
    text, value = pool[0]
    return (text[1:-1] if text.startswith("(") else text), value


@dataclass(repr=False)
class CountdownTask(Task):
    """Options (keyword arguments of ``get_task("countdown", ...)``):"""

    count: int = 3
    """How many numbers each problem gives."""
    max_number: int = 20
    """Numbers are drawn from 1..max_number."""
    max_target: int = 100
    """Targets are integers in 1..max_target, never equal to one of the given numbers."""
    format_weight: float = 0.1
    """Weight of the reward for writing an <answer>...</answer> tag at all: a weak model learns the format first."""
    prompt_template: str = PROMPT
    """``{numbers}`` and ``{target}`` are filled in."""
    system_prompt: str | None = None

    def __post_init__(self) -> None:
        if self.count < 2 or self.max_number < 1 or self.max_target < 1:
            raise ValueError("countdown: needs count >= 2, max_number >= 1 and max_target >= 1")
        self.name = "countdown"
        self.reward_fns = [countdown_correct, format_reward(r".*<answer>.+?</answer>.*", name="answer_tag")]
        self.reward_weights = [1.0, self.format_weight]

    def make_row(self, rng: random.Random) -> dict[str, Any]:
        for _ in range(MAX_DRAWS):
            numbers = [rng.randint(1, self.max_number) for _ in range(self.count)]
            chosen = rng.sample(numbers, rng.randint(2, self.count))
            drawn = _random_expression(rng, chosen)
            if drawn is None:
                continue
            solution, value = drawn
            if value.denominator == 1 and 1 <= value <= self.max_target and value not in numbers:
                target = int(value)
                prompt = self.prompt_template.format(numbers=", ".join(map(str, numbers)), target=target)
                return {"prompt": prompt, "answer": target, "numbers": numbers, "solution": solution}
        raise ValueError(f"countdown: no solvable problem found in {MAX_DRAWS} draws; raise max_target "
                         f"({self.max_target}) or max_number ({self.max_number})")

    def is_correct(self, completion: str, row: dict[str, Any]) -> bool:
        return check_solution(completion, row["numbers"], row["answer"])
