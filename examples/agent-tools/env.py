"""An environment for examples/agent-tools/run.yaml: unit-conversion questions the policy answers with
the help of the ``convert_units`` tool (tools.py, listed under ``tools:`` in run.yaml).

The protocol is two methods (grouprl.envs.base): ``reset(*, seed, options)`` returns the opening
observation (text, one user turn) and an info dict; ``step(action)`` gets the policy's answer (a turn
without a tool call: the tool calls in between are answered by grouprl itself) and returns
``(observation, reward, terminated, truncated, info)``. One answer ends an episode here, with reward 1
when it is within 1% of the right value; ``info["success"]`` feeds the env/success metric.
"""

from __future__ import annotations

import random
import re
from typing import Any

QUESTIONS = (
    # (from, to, how many `to` one `from` is): the same exact definitions as tools.py
    ("mi", "km", 1.609344), ("km", "mi", 1 / 1.609344), ("ft", "m", 0.3048), ("in", "cm", 2.54),
    ("lb", "kg", 0.45359237), ("oz", "g", 28.349523125), ("gal", "l", 3.785411784), ("cup", "ml", 236.5882365),
)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
TOLERANCE = 0.01
"""Relative error an answer may have: rounding to three significant figures stays well inside it."""


def last_number(text: str) -> float | None:
    """The last number written in ``text`` (thousands separators allowed), or None."""
    found = NUMBER.findall(text)
    return float(found[-1].replace(",", "")) if found else None


class UnitQuiz:
    """One conversion question per episode, drawn from ``QUESTIONS`` by the reset's seed. Options:
    ``low`` and ``high`` bound the quantity (drawn with one decimal)."""

    def __init__(self, low: float = 1.0, high: float = 200.0):
        if not 0 < low < high:
            raise ValueError(f"UnitQuiz needs 0 < low < high, got low={low}, high={high}")
        self.low, self.high = low, high
        self.expected = 0.0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        rng = random.Random(seed)
        source, target, factor = rng.choice(QUESTIONS)
        value = round(rng.uniform(self.low, self.high), 1)
        self.expected = value * factor
        return (f"How many {target} is {value} {source}? Call the convert_units tool to find out, then reply with "
                "just the number."), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        answer = last_number(action)
        right = answer is not None and abs(answer - self.expected) <= TOLERANCE * abs(self.expected)
        feedback = "Correct." if right else f"Not quite: it is {self.expected:.4g}."
        return feedback, float(right), True, False, {"success": right}
