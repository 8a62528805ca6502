"""A tool task: two-digit arithmetic with a ``calculator`` tool. A turn without a tool call is the answer (reward 1
when it holds the result); each game opens with one solved example, since a small model copies a format it has
seen far more readily than one it is told about.
"""

from __future__ import annotations

import ast
import json
import operator
import random
from typing import Any

from grouprl.envs.base import ENVIRONMENTS
from grouprl.envs.last_integer import last_integer

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.USub: operator.neg, ast.UAdd: operator.pos}
LARGEST = 10**12  # the tool is for arithmetic, not for building huge numbers


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        value = OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    elif isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
        value = OPERATORS[type(node.op)](_evaluate(node.operand))
    else:
        raise ValueError("only numbers and + - * / ( ) are allowed")
    if abs(value) > LARGEST:
        raise ValueError("the result is too large")
    return value


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: numbers with + - * / and parentheses, for example "23 * 47".

    >>> calculator("23 * 47"), calculator("7 / 2")
    ('1081', '3.5')
    """
    value = _evaluate(ast.parse(expression.strip(), mode="eval").body)
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


class Calculator:
    """Options: ``low``, ``high`` (the operands' range), ``operations`` (e.g. "+-*"), ``show_call`` (the
    question shows the call to make), ``worked_example`` (open with one solved exchange)."""

    tools = (calculator,)  # they join the run's tools

    def __init__(self, low: int = 10, high: int = 99, operations: str = "+", show_call: bool = True,
                 worked_example: bool = True):
        if not 0 <= low <= high or not operations or set(operations) - set("+-*"):
            raise ValueError(f"calculator needs 0 <= low <= high and operations from '+-*', got {low}, {high}, "
                             f"{operations!r}")
        self.low, self.high, self.operations, self.show_call = low, high, operations, show_call
        self.worked_example = worked_example
        self.answer = 0

    def question(self, a: int, op: str, b: int) -> tuple[str, str]:
        """The question about ``a op b`` and the call that answers it."""
        call = "<tool_call>" + json.dumps({"name": "calculator", "arguments": {"expression": f"{a} {op} {b}"}}) + \
            "</tool_call>"
        if self.show_call:
            return (f"What is {a} {op} {b}? First call the calculator by replying with exactly this line:\n"
                    f"{call}\nThen reply with just the number it gives."), call
        return f"What is {a} {op} {b}? Use the calculator, then reply with just the number.", call

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        rng = random.Random(seed)
        a, b, op = rng.randint(self.low, self.high), rng.randint(self.low, self.high), rng.choice(self.operations)
        self.answer = int(calculator(f"{a} {op} {b}"))
        text, _ = self.question(a, op, b)
        if not self.worked_example:
            return text, {}
        ea, eb, eop = rng.randint(self.low, self.high), rng.randint(self.low, self.high), rng.choice(self.operations)
        example, call = self.question(ea, eop, eb)
        result = calculator(f"{ea} {eop} {eb}")
        return [{"role": "user", "content": example}, {"role": "assistant", "content": call},
                {"role": "tool", "name": "calculator", "content": result}, {"role": "assistant", "content": result},
                {"role": "user", "content": text}], {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        right = last_integer(action) == self.answer
        return ("Correct." if right else f"Wrong: it is {self.answer}."), float(right), True, False, {"success": right}


ENVIRONMENTS.register("calculator", Calculator)
