"""A reward that runs generated Python against a row's ``tests`` in an OS sandbox, and scores it outside, where
the expected values stay (so no code inside can forge them). A case is stdin/stdout (``{"input": "2 3\\n",
"output": "5"}``, trailing whitespace ignored) or a call (``{"call": "add", "args": [2, 3], "expected": 5}`` or
``"assert add(2, 3) == 5"``, the result read back with ``ast.literal_eval``). The reward is the fraction of cases
passed; None without tests.
"""

from __future__ import annotations

import ast
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from grouprl.rewards.builtin import REWARDS, RewardList
from grouprl.rewards.sandbox import Sandbox, SandboxLimits

CODE_BLOCK = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(completion: str) -> str:
    """The last fenced code block (```python ... ```), or the whole completion if it has none.

    >>> extract_code("Here:\\n```python\\nprint(1)\\n```\\nDone.")
    'print(1)\\n'
    """
    blocks = CODE_BLOCK.findall(completion)
    return blocks[-1] if blocks else completion


@dataclass(frozen=True)
class Call:
    """``name(*args, **kwargs) == expected``."""
    name: str
    args: tuple
    kwargs: dict
    expected: Any


def parse_assert(test: str) -> Call:
    """``assert f(literal args) == literal`` (either side) as a :class:`Call`.

    >>> parse_assert("assert add(2, b=-3) == -1")
    Call(name='add', args=(2,), kwargs={'b': -3}, expected=-1)
    """
    try:
        node = ast.parse(test.strip()).body
        (stmt,) = node
        compare = stmt.test
        (op,) = compare.ops
        (right,) = compare.comparators
        if not isinstance(stmt, ast.Assert) or not isinstance(op, ast.Eq):
            raise ValueError
        call, value = (compare.left, right) if isinstance(compare.left, ast.Call) else (right, compare.left)
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
            raise ValueError
        return Call(call.func.id, tuple(ast.literal_eval(a) for a in call.args),
                    {k.arg: ast.literal_eval(k.value) for k in call.keywords}, ast.literal_eval(value))
    except (ValueError, SyntaxError, AttributeError, TypeError) as e:
        raise ValueError(f"test {test!r} cannot be scored outside the program: write it as 'assert f(args) == "
                         "result' with literal arguments and result, or as {'call', 'args', 'expected'}") from e


def parse_case(case: Any) -> Call | dict:
    """A test case as a :class:`Call` or a ``{"input", "output"}`` dict; a clear error otherwise."""
    if isinstance(case, str):
        return parse_assert(case)
    if isinstance(case, dict) and "output" in case:
        return case
    if isinstance(case, dict) and "call" in case and "expected" in case:
        return Call(str(case["call"]), tuple(case.get("args", ())), dict(case.get("kwargs", {})), case["expected"])
    raise ValueError(f"test case {case!r:.200}: give an assert string, {{'input', 'output'}} or "
                     "{'call', 'args', 'expected'}")


def _outputs_match(got: str, expected: str) -> bool:
    """Same lines once trailing whitespace and trailing blank lines are ignored."""
    return [line.rstrip() for line in got.rstrip().splitlines()] == \
        [line.rstrip() for line in str(expected).rstrip().splitlines()]


def _same(returned: str, expected: Any) -> bool:
    if returned.startswith("!"):
        return False
    try:
        value = ast.literal_eval(returned)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False
    try:
        return bool(value == expected)  # what the test's own ``assert ... ==`` would have said
    except Exception:  # noqa: BLE001 - a literal that cannot be compared does not pass
        return False


class CodeExecutionReward:
    """Fraction of a row's test cases the completion's code passes; rows run in threads, one sandbox each."""

    name = "code_execution"

    def __init__(self, limits: SandboxLimits | None = None, workers: int | None = None, isolation: str = "bubblewrap"):
        self.sandbox = Sandbox(limits or SandboxLimits(), isolation=isolation)
        self.workers = workers or max(1, min(4, os.cpu_count() or 1))

    @property
    def isolation(self) -> str:
        """What isolates the programs, in one line (shown in the run's log and report)."""
        return self.sandbox.description

    def score(self, completion: str, tests: list[Any] | None) -> float | None:
        """Fraction of ``tests`` passed by the code in ``completion``."""
        if not tests:
            return None
        cases = [parse_case(t) for t in tests]
        code = extract_code(completion)
        calls = [c for c in cases if isinstance(c, Call)]
        passed = 0
        if calls:
            result = self.sandbox.run(code, calls=[(c.name, repr(c.args), repr(c.kwargs)) for c in calls])
            if result.returned is not None:
                passed += sum(_same(got, c.expected) for got, c in zip(result.returned, calls))
        for case in (c for c in cases if isinstance(c, dict)):
            result = self.sandbox.run(code, stdin=str(case.get("input", "")))
            ran = not result.timed_out and result.returncode == 0
            passed += ran and _outputs_match(result.stdout, case["output"])
        return passed / len(cases)

    def __call__(self, prompts: list[Any], completions: list[str], *, tests: list[list[Any] | None]) -> RewardList:
        for row in tests:  # a malformed test is the data's fault: say so before any program runs
            for case in row or []:
                parse_case(case)
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            return list(pool.map(self.score, completions, tests))


def code_execution_reward(timeout_s: float = 5.0, memory_mb: int = 512, workers: int | None = None,
                          isolation: str = "bubblewrap") -> CodeExecutionReward:
    """:class:`CodeExecutionReward` from a config's flat options; ``isolation: unsafe`` is for trusted code only."""
    return CodeExecutionReward(SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb), workers=workers,
                               isolation=isolation)


REWARDS.register("code_execution", code_execution_reward)
