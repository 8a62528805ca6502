"""The ``arithmetic`` task: seeded sums whose difficulty is set by digits, operations and operands.

The checker reads the last ``<answer>`` tag, else the last number, and is strict about the value. The default
is calibrated so that groups disagree.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from grouprl.rewards.builtin import answers_match, exact_match, extract_answer
from grouprl.tasks.base import Task, evaluate_expression

OPERATIONS = "+-*"
PROMPT = "What is {expression}? Answer with just the number."


@dataclass(repr=False)
class ArithmeticTask(Task):
    """Options (all keyword arguments of ``get_task("arithmetic", ...)``):"""

    digits: int = 1
    """Each operand has 1..digits digits (0..9 for 1 digit, 0..99 for 2)."""
    operations: str = "+-"
    """Operators drawn from, any of "+-*"."""
    operands: int = 2
    """Numbers per problem; with more than 2, usual precedence applies (* before + and -)."""
    allow_negative: bool = False
    """If False, problems whose result is negative are redrawn."""
    prompt_template: str = PROMPT
    """``{expression}`` is replaced by the problem, e.g. "7 + 5"."""
    system_prompt: str | None = None
    """None keeps the model's own default system prompt (the chat template adds it)."""

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 9:
            raise ValueError(f"arithmetic: digits must be 1..9, got {self.digits}")
        if not self.operations or set(self.operations) - set(OPERATIONS):
            raise ValueError(f"arithmetic: operations must be a non-empty string of {OPERATIONS!r}, "
                             f"got {self.operations!r}")
        if self.operands < 2:
            raise ValueError(f"arithmetic: operands must be >= 2, got {self.operands}")
        if "{expression}" not in self.prompt_template:
            raise ValueError("arithmetic: prompt_template must contain '{expression}'")
        self.name = "arithmetic"
        self.reward_fns = [exact_match]
        self.reward_weights = [1.0]

    def make_row(self, rng: random.Random) -> dict[str, Any]:
        high = 10 ** self.digits - 1
        while True:
            numbers = [rng.randint(0, high) for _ in range(self.operands)]
            ops = [rng.choice(self.operations) for _ in range(self.operands - 1)]
            expression = " ".join([str(numbers[0])] + [f"{op} {n}" for op, n in zip(ops, numbers[1:])])
            value, _ = evaluate_expression(expression)
            # an answer equal to an operand (7 + 0) would reward merely repeating the question
            if (self.allow_negative or value >= 0) and value not in numbers:
                break
        return {"prompt": self.prompt_template.format(expression=expression), "answer": int(value),
                "expression": expression}

    def is_correct(self, completion: str, row: dict[str, Any]) -> bool:
        return answers_match(extract_answer(completion), row["answer"])
