"""The compiled decode step in each layout of its matrix products, forced, in whole bf16 rollouts of
SmolLM2-135M-Instruct.

The compiled step (``grouprl/rollout/compiled.py``) runs each product in the layout the learner
(``grouprl/rollout/skinny.py``) chose for it in eager steps: ``x @ W.T`` (0) or ``(W @ x.T).T`` (1).
The learner times each product alone, so a graph whose products do not compose well (one product's
output layout slowing the next) would keep a slow step for the whole run. This benchmark forces the
layouts instead, one digit per product of a stacked step (q/k/v stack, o, gate/up stack, down, LM
head), each in a fresh process (one graph per process), and times rollouts after two warm-up
rollouts (the first compiles).

    python benchmarks/compiled_layouts.py [--layouts 11111,00000,11101,...] [--rows 16] [--tokens 64]

Prints, per layout, milliseconds per compiled step over ``--repeats`` rollouts (the same seeds for every
layout); the last line is ``slowest_over_fastest=<ratio>``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import torch
from machine import start_under_allocator  # benchmarks/machine.py: every figure names its CPU

from grouprl.models import load_policy
from grouprl.rollout.cpu import compiled
from grouprl.rollout.sampler import Sampler
from grouprl.types import SamplingParams

G = 4


def force_layouts(layouts: str) -> None:
    """Every decided layout of the compiled step's plan replaced by the next digit of ``layouts``."""
    decided, calls = compiled._decided_layout, iter(range(1 << 30))

    def forced(products, module, rows, dtype):
        if decided(products, module, rows, dtype) is None:  # the step compiles when the learner is done
            return None
        return int(layouts[next(calls) % len(layouts)])

    compiled._decided_layout = forced


def one_layout(args: argparse.Namespace) -> None:
    """Run in a child: time compiled rollouts in ``args.child``'s layouts, print one result line."""
    torch.set_num_threads(args.threads)
    force_layouts(args.child)
    model, tokenizer = load_policy("smollm2-135m", dtype=torch.float32)
    sampler = Sampler(model, tokenizer, compile_steps=True)
    ids = [tokenizer(f"What is {7 + i}+{(3 * i) % 10 + 1}? Answer with just the number.")["input_ids"]
           for i in range(args.rows // G)]
    params = SamplingParams(max_new_tokens=args.tokens, temperature=1.0, format="bf16")
    for seed in range(2):
        sampler.generate(ids, G, params, seed=seed)
    step = sampler.compiled
    steps, start = step.steps, time.perf_counter()
    for seed in range(args.repeats):
        sampler.generate(ids, G, params, seed=100 + seed)
    seconds, steps = time.perf_counter() - start, step.steps - steps
    print(f"layouts {args.child} (plan {''.join(map(str, step.plan.layouts))}): {seconds / steps * 1e3:.1f} ms a "
          f"compiled step, {steps} steps in {seconds:.2f} s, compiled in {step.compile_seconds:.0f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", default="11111,00000,11101,00010", help="comma-separated digit strings")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed rollouts per layout")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        one_layout(args)
        return
    start_under_allocator("auto", args.threads)
    per_step = {}
    for layouts in args.layouts.split(","):
        cmd = [sys.executable, __file__, "--child", layouts, *(f"--{k}={getattr(args, k)}" for k in
                                                                 ("rows", "tokens", "repeats", "threads"))]
        line = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        print(line, flush=True)
        per_step[layouts] = float(line.split(": ")[1].split(" ms")[0])
    print(f"slowest_over_fastest={max(per_step.values()) / min(per_step.values()):.2f}")


if __name__ == "__main__":
    main()
