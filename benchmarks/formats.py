"""fp32 against bf16 matrix products on this machine, at a decode step's size and at a training pass's, and the
formats ``dtype: auto`` takes here (``grouprl/models/precision.py``'s rule table). A run never measures: this is
what a row of that table rests on, measured on purpose.

The shapes are SmolLM2-135M's MLP (576 x 1536). Decode: ``--decode_rows`` rows times as many distinct weights as
fill 64 MiB in fp32, so they stream from memory as in a decode step. Training: ``--train_rows`` rows times one
weight. fp32 and bf16 take their trials in turn (so load from other processes falls on both alike), and each
ratio is the median over ``--rounds`` rounds, with the spread of the rounds beside it: on a shared machine a
single timing moves by several times.

    python benchmarks/formats.py [--threads 1] [--rounds 9]
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 python benchmarks/formats.py   # as an AVX2-only CPU
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from machine import cpu_line
from smoke import add_smoke, shrink
from torch.nn import functional as F

from grouprl.models.precision import resolve_formats, rule_for, this_machine

HIDDEN, WIDTH = 576, 1536
STREAM_BYTES = 64 << 20


def seconds(x: torch.Tensor, weights: list[torch.Tensor], repeats: int) -> float:
    """Seconds of ``x`` [rows, in] times every weight's transpose, best of ``repeats``."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for w in weights:
            F.linear(x, w)
        best = min(best, time.perf_counter() - start)
    return best


def ratio(rows: int, count: int, rounds: int, repeats: int) -> list[float]:
    """fp32 time over bf16 time of ``rows`` x ``count`` weights, once per round (> 1: bf16 is faster)."""
    x = torch.rand(rows, HIDDEN)
    weights = [torch.rand(WIDTH, HIDDEN) for _ in range(count)]
    low = [w.bfloat16() for w in weights]
    seconds(x, weights, 1), seconds(x.bfloat16(), low, 1)  # first use: oneDNN's kernel choice, page faults
    out = []
    for _ in range(rounds):
        fp32 = seconds(x, weights, repeats)
        bf16 = seconds(x.bfloat16(), low, repeats)
        out.append(fp32 / bf16)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--repeats", type=int, default=3, help="timings per round and format (the best counts)")
    parser.add_argument("--decode_rows", type=int, default=16)
    parser.add_argument("--train_rows", type=int, default=2048)
    add_smoke(parser, "one round, one timing, 2 decode rows and 8 training rows")
    args = shrink(parser.parse_args(), rounds=1, repeats=1, decode_rows=2, train_rows=8)
    torch.set_num_threads(args.threads)
    machine = this_machine()
    print(cpu_line(), f"threads {args.threads}", flush=True)
    print(f"rule: {rule_for(machine).name}; dtype auto: {resolve_formats('auto', 'auto', 'auto').describe()}",
          flush=True)
    streamed = max(1, STREAM_BYTES // (4 * HIDDEN * WIDTH))
    for name, rows, count in (("decode", args.decode_rows, streamed), ("training", args.train_rows, 1)):
        got = ratio(rows, count, args.rounds, args.repeats)
        print(f"{name}: {rows} rows x {count} weight(s) {WIDTH} x {HIDDEN}: bf16 {statistics.median(got):.2f}x fp32 "
              f"(median of {len(got)} rounds; {min(got):.2f}-{max(got):.2f}x)", flush=True)


if __name__ == "__main__":
    main()
