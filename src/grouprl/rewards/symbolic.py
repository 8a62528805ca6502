"""math-verify's symbolic equality of two answers, bounded in any thread.

math-verify's timeouts use SIGALRM, which only the main thread receives; reward functions also run in the
rollout thread, so there a batch's comparisons run in one child interpreter (this file as a script), killed if
it overruns. Answers that would blow up the parser (too long, too deep, power towers) are refused first.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading

TIMEOUT = 5
"""Seconds math-verify may spend parsing, and again comparing, one pair."""
MAX_CHARS = 300
"""Longest answer handed to math-verify."""
MAX_DEPTH = 8
"""Deepest bracket nesting handed to math-verify: its parser is exponential in nested bare braces."""
CHILD_START = 30
"""Seconds the child interpreter may take to start and import math-verify."""
# Power towers and six-digit exponents make sympy compute giant integers in one C call no signal interrupts.
_TOWER = re.compile(r"\^\s*[{(][^{}()]*\^|\^\s*\d+\s*\^|\^\s*[{(]?\s*\d{6,}")


def tractable(answer: str) -> bool:
    """Whether ``answer`` may go to math-verify (the caps of the module docstring).

    >>> tractable("x^2+1"), tractable("{" * 9 + "1" + "}" * 9), tractable("9^{9^{9}}"), tractable("x" * 301)
    (True, False, False, False)
    """
    if len(answer) > MAX_CHARS or _TOWER.search(answer):
        return False
    depth = deepest = 0
    for char in answer:
        depth += (char in "{([") - (char in "})]")
        deepest = max(deepest, depth)
    return deepest <= MAX_DEPTH


def equal(pred: str, gold: str, timeout: int | None = TIMEOUT) -> bool:
    r"""math-verify's equivalence of two answers read as LaTeX math (``timeout`` None: none, off the main thread).

    >>> equal(r"\frac{2}{4}", "0.5"), equal("(x+1)^2", "x^2+2x+1"), equal(r"\{1,2\}", r"\{2,1\}"), equal("x", "y")
    (True, True, True, False)
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    configs = [LatexExtractionConfig(), ExprExtractionConfig()]

    def read(answer: str) -> list:
        return parse(f"${answer}$", extraction_config=configs, parsing_timeout=timeout)

    try:
        gold_parsed, pred_parsed = read(gold), read(pred)
        return bool(gold_parsed and pred_parsed) and bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout))
    except Exception:  # noqa: BLE001 - sympy raises many kinds on odd input; none of them is a match
        return False


def equal_all(pairs: list[tuple[str, str]], child_limit: float | None = None) -> list[bool]:
    """:func:`equal` for each ``(pred, gold)`` pair, with timeouts: here in the main thread, elsewhere in a child
    interpreter killed after ``child_limit`` seconds (default: room for every pair's timeouts); unanswered: False."""
    if not pairs:
        return []
    if threading.current_thread() is threading.main_thread():
        return [equal(pred, gold) for pred, gold in pairs]
    limit = CHILD_START + (2 * TIMEOUT + 1) * len(pairs) if child_limit is None else child_limit
    try:
        done = subprocess.run([sys.executable, "-I", __file__], input=json.dumps(pairs), capture_output=True,
                              text=True, timeout=limit)
    except subprocess.TimeoutExpired as e:
        out = e.stdout or ""
        lines = (out.decode() if isinstance(out, bytes) else out).split()
    else:
        lines = done.stdout.split()
        if done.returncode != 0 and len(lines) < len(pairs):
            raise RuntimeError(f"math-verify's child process failed ({sys.executable} -I {__file__}, exit code "
                               f"{done.returncode}): {done.stderr.strip()[-500:]}")
    answered = [line == "1" for line in lines[:len(pairs)]]
    return answered + [False] * (len(pairs) - len(answered))


def _main() -> None:
    """The child: [pred, gold] pairs as JSON on stdin, 1 or 0 per pair on stdout, flushed so a kill keeps them."""
    for pred, gold in json.load(sys.stdin):
        print(int(equal(pred, gold)), flush=True)


if __name__ == "__main__":
    _main()
