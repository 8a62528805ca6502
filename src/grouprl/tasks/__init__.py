"""Built-in tasks by name: ``get_task("arithmetic", digits=2)``, ``get_task("countdown")``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from grouprl.registry import Registry
from grouprl.tasks.arithmetic import ArithmeticTask
from grouprl.tasks.base import ExpressionError, Task, evaluate_expression
from grouprl.tasks.countdown import CountdownTask

TASKS: Registry[Callable[..., Task]] = Registry("task")
TASKS.register("arithmetic", ArithmeticTask)
TASKS.register("countdown", CountdownTask)


def get_task(name: str, **options: Any) -> Task:
    """The built-in task ``name`` with ``options`` (its dataclass fields; an unknown one lists the valid ones)."""
    factory = TASKS.get(name)
    if dataclasses.is_dataclass(factory):
        valid = [f.name for f in dataclasses.fields(factory)]
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise TypeError(f"unknown option(s) {unknown} for task {name!r}; valid options: {', '.join(valid)}")
    return factory(**options)


__all__ = ["TASKS", "ArithmeticTask", "CountdownTask", "ExpressionError", "Task", "evaluate_expression", "get_task"]
