"""Decode-step attention: ``grouprl.rollout.attention``'s two kernels, PyTorch's fused SDPA on grouped heads
against two batched products around a float32 softmax, on SmolLM2's heads (9 query heads on 3 key/value
heads, 64 wide), one new query per row against views of a preallocated cache, with a padding mask.

    python benchmarks/attention.py [--rows 2,16,32] [--positions 90,300] [--formats fp32,bf16] [--threads 2]

Prints microseconds per call of one layer (median of ``--repeats`` timings of ``--calls`` calls), the
fused kernel's time over the products' and which kernel ``grouped_attention`` runs in that format here;
the last line is ``fused_over_products=<geometric mean ratio>`` per format.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
from machine import cpu_line  # benchmarks/machine.py: every figure says which CPU it came from
from smoke import add_smoke, shrink

from grouprl.rollout import attention

HEADS, KV_HEADS, WIDTH = 9, 3, 64
FORMATS = {"fp32": torch.float32, "bf16": torch.bfloat16}


def median_us(fn, args: tuple, calls: int, repeats: int) -> float:
    for _ in range(20):
        fn(*args)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="2,16,32")
    parser.add_argument("--positions", default="90,300", help="cached + new positions")
    parser.add_argument("--formats", default="fp32,bf16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    add_smoke(parser, "2 rows, 8 positions, fp32, 2 calls")
    args = shrink(parser.parse_args(), rows="2", positions="8", formats="fp32", calls=2, repeats=1)
    torch.set_num_threads(args.threads)
    print(cpu_line(), f"(torch threads {args.threads})", flush=True)
    ratios: dict[str, list[float]] = {}
    for fmt in args.formats.split(","):
        dtype = FORMATS[fmt]
        picked = attention._products if dtype == torch.float32 else attention._fused
        for rows in map(int, args.rows.split(",")):
            for length in map(int, args.positions.split(",")):
                torch.manual_seed(0)
                cache_k = torch.randn(rows, KV_HEADS, length + 64, WIDTH, dtype=dtype)  # spare capacity, as the
                cache_v = torch.randn(rows, KV_HEADS, length + 64, WIDTH, dtype=dtype)  # engine's caches have
                k, v = cache_k[:, :, :length], cache_v[:, :, :length]
                q = torch.randn(rows, HEADS, 1, WIDTH, dtype=dtype)
                mask = torch.ones(rows, 1, 1, length, dtype=torch.bool)
                mask[0, ..., :7] = False  # one left-padded row
                inputs = (q, k, v, mask, WIDTH ** -0.5)
                fused = median_us(attention._fused, inputs, args.calls, args.repeats)
                plain = median_us(attention._products, inputs, args.calls, args.repeats)
                ratios.setdefault(fmt, []).append(fused / plain)
                print(f"{fmt} rows {rows:3d} positions {length:4d}: fused {fused:7.1f} us  products {plain:7.1f} us  "
                      f"fused/products {fused / plain:.2f}  (runs: {picked.__name__.strip('_')})", flush=True)
    print(" ".join(f"fused_over_products[{fmt}]={math.exp(statistics.mean(map(math.log, r))):.2f}"
                   for fmt, r in ratios.items()))


if __name__ == "__main__":
    main()
