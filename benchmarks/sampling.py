"""Drawing the next token: ``grouprl.rollout.picking.pick_tokens`` (a two-level draw, block then token)
against the same draw by one float64 running sum over the whole vocabulary, at SmolLM2's vocabulary.

Both draw each row with one uniform by inverting its cumulative distribution (the same tokens but at
rounding boundaries); the flat version is the straightforward way, kept here as the comparison.

    python benchmarks/sampling.py [--rows 16,64] [--threads 1,2] [--vocab 49152]

Prints milliseconds per call (median of ``--repeats``) for each row count and thread count, and how many
of the draws differ; the last line is ``speedup=<flat / two-level>`` at the first rows and threads.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from machine import cpu_line  # benchmarks/machine.py: every figure says which CPU it came from
from smoke import add_smoke, shrink

from grouprl.rollout.picking import pick_tokens
from grouprl.types import SamplingParams


def flat_draw(logits: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Temperature-1 draw through one float64 running sum: (tokens [b], log-probs [b])."""
    logp = torch.log_softmax(logits, -1)
    cdf = logp.exp().double().cumsum(-1)  # [b, V]
    total = cdf[:, -1:]
    drawn = torch.searchsorted(cdf, u.double().unsqueeze(-1) * total, right=True)
    tokens = torch.minimum(drawn, (cdf < total).sum(-1, keepdim=True)).squeeze(-1)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def median_ms(fn, args: tuple, repeats: int) -> float:
    for _ in range(5):
        fn(*args)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="16,64")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--vocab", type=int, default=49152, help="SmolLM2's")
    parser.add_argument("--repeats", type=int, default=200)
    add_smoke(parser, "4 rows, one thread, a vocabulary of 1024, 2 timings")
    args = shrink(parser.parse_args(), rows="4", threads="1", vocab=1024, repeats=2)
    print(cpu_line(), flush=True)
    params = SamplingParams(max_new_tokens=1, temperature=1.0)
    ratios = []
    for threads in map(int, args.threads.split(",")):
        torch.set_num_threads(threads)
        for rows in map(int, args.rows.split(",")):
            g = torch.Generator().manual_seed(rows)
            logits = torch.randn(rows, args.vocab, generator=g) * 3.0
            u = torch.rand(rows, generator=g, dtype=torch.float64)
            ours = median_ms(pick_tokens, (logits, params, u), args.repeats)
            flat = median_ms(flat_draw, (logits, u), args.repeats)
            differ = int((pick_tokens(logits, params, u)[0] != flat_draw(logits, u)[0]).sum())
            ratios.append(flat / ours)
            print(f"{threads} threads, {rows} rows: two-level {ours:.2f} ms, flat float64 {flat:.2f} ms "
                  f"({flat / ours:.1f}x); {differ} of {rows} draws differ", flush=True)
    print(f"speedup={ratios[0]:.2f}")


if __name__ == "__main__":
    main()
