"""What a task is (a seeded prompt source, its reward functions, a strict answer checker), and a safe evaluator
of arithmetic expressions."""

from __future__ import annotations

import ast
import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from fractions import Fraction
from typing import Any

SPLITS = ("train", "eval")
MAX_EXPRESSION_CHARS = 200
"""Longer expressions are rejected before parsing: ``ast.parse`` recursion grows with nesting."""


class Task(ABC):
    """Subclasses set the attributes below and implement :meth:`make_row` and :meth:`is_correct`."""

    name: str
    system_prompt: str | None = None
    reward_fns: list[Callable[..., list[float | None]]]
    reward_weights: list[float]

    @abstractmethod
    def make_row(self, rng: random.Random) -> dict[str, Any]:
        """One problem drawn with ``rng``: ``{"prompt": ..., "answer": ..., ...}``."""

    @abstractmethod
    def is_correct(self, completion: str, row: dict[str, Any]) -> bool:
        """Whether ``completion`` solves ``row`` (the evaluation metric)."""

    def rows(self, split: str, n: int, seed: int) -> list[dict[str, Any]]:
        """``n`` problems of ``split`` ("train" or "eval"), the same for the same seed, each split its own stream."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
        if n < 0:
            raise ValueError(f"number of rows must be >= 0, got {n}")
        # random.Random hashes a string seed with SHA-512: stable across runs and processes
        rng = random.Random(f"{self.name}/{split}/{seed}")
        return [self.make_row(rng) for _ in range(n)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class ExpressionError(ValueError):
    """Text that is not a plain arithmetic expression, or one that cannot be evaluated."""


_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b}


def evaluate_expression(text: str, allow_unary_minus: bool = False) -> tuple[Fraction, list[int]]:
    """Exact value of an expression of integers, ``+ - * /`` and parentheses, and its integer literals in order;
    walked by hand with ``ast``, nothing executed.

    >>> evaluate_expression("(25 - 5) / 4 * 3")
    (Fraction(15, 1), [25, 5, 4, 3])
    >>> evaluate_expression("2 ** 10")
    Traceback (most recent call last):
    ...
    grouprl.tasks.base.ExpressionError: operator Pow is not allowed (use + - * / and parentheses)
    """
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ExpressionError(f"not an expression: {text!r}") from e
    literals: list[int] = []
    return _walk(tree.body, literals, allow_unary_minus), literals


def _walk(node: ast.AST, literals: list[int], allow_unary_minus: bool) -> Fraction:
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:  # bool is an int subclass; floats are inexact
            raise ExpressionError(f"only integers are allowed, got {node.value!r}")
        literals.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left = _walk(node.left, literals, allow_unary_minus)
        right = _walk(node.right, literals, allow_unary_minus)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ExpressionError("division by zero")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and allow_unary_minus:
        return -_walk(node.operand, literals, allow_unary_minus)
    if isinstance(node, ast.BinOp | ast.UnaryOp):
        raise ExpressionError(f"operator {type(node.op).__name__} is not allowed (use + - * / and parentheses)")
    raise ExpressionError(f"{type(node).__name__} is not allowed in an arithmetic expression")
