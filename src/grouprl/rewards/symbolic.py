"""math-verify's symbolic equality of two answers, bounded in any thread.

math-verify bounds its work with SIGALRM, which only the main thread receives, and reward functions also
run in the rollout thread of asynchronous training, where ``(a+b+c+d+e+f+g+h+1)^{12}`` keeps sympy busy for
minutes. Outside the main thread a batch's comparisons therefore run in one child interpreter (this file as
a script), killed if it overruns. Answers that would blow up the parser (longer than MAX_CHARS, deeper than
MAX_DEPTH, power towers, six-digit exponents) are refused before either.
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
# Power towers (9^{9^9}, (9^9)^(9^9), 10^10^10) and exponents of 6 digits or more make sympy compute giant
# integers inside one C call, which no signal interrupts.
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
    r"""math-verify's equivalence of two answers, each read as LaTeX math (``timeout`` None: no
    timeouts, for a thread that cannot have them).

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
    """:func:`equal` for each ``(pred, gold)`` pair, with timeouts: in this process in the main
    thread, in a child interpreter elsewhere, killed after ``child_limit`` seconds (default: room
    to start and for every pair's timeouts). A pair left unanswered by a killed child is False."""
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
    """The child: a JSON list of [pred, gold] pairs on stdin, one line per pair (1 or 0) on stdout,
    flushed as it goes so a kill keeps what is done."""
    for pred, gold in json.load(sys.stdin):
        print(int(equal(pred, gold)), flush=True)


if __name__ == "__main__":
    _main()
