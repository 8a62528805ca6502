"""What the code sandbox costs per program: bubblewrap against a plain child process (``isolation:
unsafe``, the same harness, limits and timeout), programs run one after another.

    python benchmarks/sandbox.py [--programs 40]

Two programs: a trivial one (the fixed cost of starting an isolated interpreter) and a graded
solution with three function-call cases. The last line is ``overhead_ms=<median bubblewrap - median
unsafe, trivial program>``.
"""

from __future__ import annotations

import argparse
import statistics
import time

from machine import cpu_line
from smoke import add_smoke, shrink

from grouprl.rewards.code import CodeExecutionReward
from grouprl.rewards.sandbox import Sandbox

SOLUTION = "```python\ndef add(a, b):\n    return a + b\n```"
TESTS = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0", "assert add(10, 0) == 10"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", type=int, default=40)
    add_smoke(parser, "one program each way")
    args = shrink(parser.parse_args(), programs=1)
    print(cpu_line())
    sandboxes = {name: Sandbox(isolation=name) for name in ("bubblewrap", "unsafe")}
    rewards = {name: CodeExecutionReward(isolation=name, workers=1) for name in ("bubblewrap", "unsafe")}
    trivial: dict[str, list[float]] = {n: [] for n in sandboxes}
    graded: dict[str, list[float]] = {n: [] for n in sandboxes}
    for _ in range(args.programs):  # alternate, so load from other processes falls on both alike
        for name in sandboxes:
            start = time.perf_counter()
            sandboxes[name].run("print(1)")
            trivial[name].append(time.perf_counter() - start)
            start = time.perf_counter()
            assert rewards[name].score(SOLUTION, TESTS) == 1.0
            graded[name].append(time.perf_counter() - start)
    for name in sandboxes:
        print(f"{name:>10}: trivial program {1000 * statistics.median(trivial[name]):.1f} ms, graded solution "
              f"{1000 * statistics.median(graded[name]):.1f} ms (medians of {args.programs})")
    overhead = statistics.median(trivial["bubblewrap"]) - statistics.median(trivial["unsafe"])
    print(f"overhead_ms={1000 * overhead:.1f}")


if __name__ == "__main__":
    main()
