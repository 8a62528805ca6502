"""Few-row matrix products at SmolLM2-135M's decoding shapes, one way per column: ``x @ W.T`` (what
``nn.Linear`` does, and what the built-in engine's decode steps run), ``(W @ x.T).T`` and oneDNN's linear on a
reordered copy of the weight (layouts the engine once learnt to choose between; which wins flips with the CPU),
``x @ Wt`` on a transposed copy of the weight, and MKL's packed GEMM, ``torch.ops.mkl._mkl_linear``, on
a copy packed for the row count, the first three in bf16, and the bf16-weights kernel
(``grouprl/rollout/cpu/few_rows.cpp``: panels of bf16 weights, fp32 inputs and sums), which reads half. A way this CPU
cannot run (oneDNN reorders bf16 weights only with AVX-512 BW or AVX-NE-CONVERT) prints ``-``. The table ends
with a 16-row decode step's total of the products per way (each shape's time times the count of such weights a
step reads), with the weights one by one and stacked (a layer's q, k, v as one
product, its gate, up as one: a way the engine tried and left out).

Each shape cycles through as many distinct weights as the model has of it (30 per layer shape, one LM
head), so the weights stream from memory as in a decode step, not from cache.

    python benchmarks/products.py [--threads 1] [--rows 2,4,8,16]
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 python benchmarks/products.py   # AVX2 code paths

Prints milliseconds per product, shape by shape and row count by row count.
"""

from __future__ import annotations

import argparse
import time

import torch
from machine import cpu_line
from smoke import add_smoke, shrink

from grouprl.rollout.cpu import bf16_weights

SHAPES = {"q, o (576 x 576)": (576, 576, 60, 30), "k, v (192 x 576)": (192, 576, 60, 0),
          "gate, up (1536 x 576)": (1536, 576, 60, 0), "down (576 x 1536)": (576, 1536, 30, 30),
          "LM head (49152 x 576)": (49152, 576, 1, 1), "q, k, v stacked (960 x 576)": (960, 576, 0, 30),
          "gate, up stacked (3072 x 576)": (3072, 576, 0, 30)}
"""name -> (output size, input size, how many such weights a decode step reads, how many a
step reads with a layer's q, k, v as one and its gate, up as one)."""


def per_call_ms(fn, weights, x, repeats: int) -> float:
    for w in weights[:2]:
        fn(w, x)
    start = time.perf_counter()
    for _ in range(repeats):
        for w in weights:
            fn(w, x)
    return (time.perf_counter() - start) / (repeats * len(weights)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", default="2,4,8,16")
    add_smoke(parser, "16 rows only (the step's totals need them)")
    args = shrink(parser.parse_args(), rows="16")
    torch.set_num_threads(args.threads)
    print(cpu_line(), f"threads {args.threads}", flush=True)
    linear, mm = torch.nn.functional.linear, torch.mm
    packed = lambda w, x: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")  # noqa: E731
    ways = {  # name -> (the weight it reads, the product)
        "x @ W.T": ("fp32", lambda w, x: linear(x, w)),
        "(W @ x.T).T": ("fp32", lambda w, x: mm(w, x.t()).t()),
        "oneDNN packed": ("fp32 packed", packed),
        "x @ Wt": ("fp32 transposed", lambda w, x: torch.mm(x, w)),
        "MKL packed": ("fp32 MKL", lambda w, x: torch.ops.mkl._mkl_linear(x, w[0], w[1], None, x.shape[0])),
        "bf16 x @ W.T": ("bf16", lambda w, x: linear(x.bfloat16(), w)),
        "bf16 (W@x.T).T": ("bf16", lambda w, x: mm(w, x.bfloat16().t()).t()),
        "bf16 packed": ("bf16 packed", lambda w, x: packed(w, x.bfloat16())),
        "bf16 weights": ("bf16 panels", lambda w, x: bf16_weights.product(x, w)),
    }
    kernel = bf16_weights.unavailable() is None
    print(f"{'shape':24s} {'rows':>4s} " + " ".join(f"{k:>14s}" for k in ways), flush=True)
    step = dict.fromkeys(ways, 0.0)  # a 16-row decode step's products, all shapes
    stacked_step = dict.fromkeys(ways, 0.0)  # the same with a layer's q, k, v and gate, up stacked
    for name, (out, inp, count, stacked) in SHAPES.items():
        weights = {key: [] for key in ("fp32", "fp32 packed", "fp32 transposed", "bf16", "bf16 packed",
                                       "bf16 panels")}
        for _ in range(max(count, stacked)):
            w = torch.randn(out, inp)
            for key, value in (("fp32", w), ("fp32 packed", reordered(w)), ("fp32 transposed", w.t().contiguous()),
                               ("bf16", w.bfloat16()),
                               ("bf16 packed", reordered(w.bfloat16())),
                               ("bf16 panels", bf16_weights.pack(w)[0] if kernel else None)):
                weights[key].append(value)
        repeats = 3 if count == 1 else 5
        for rows in map(int, args.rows.split(",")):
            x = torch.randn(rows, inp)
            weights["fp32 MKL"] = [mkl_packed(w, rows) for w in weights["fp32"]]  # packed for this row count
            ms = {k: None if weights[key][0] is None else per_call_ms(fn, weights[key], x, repeats)
                  for k, (key, fn) in ways.items()}
            if rows == 16:
                for k, m in ms.items():
                    step[k] += count * (float("nan") if m is None else m)
                    stacked_step[k] += stacked * (float("nan") if m is None else m)
            print(f"{name:24s} {rows:4d} " + " ".join(f"{'-':>14s}" if m is None else f"{m:11.3f} ms"
                                                      for m in ms.values()), flush=True)
    if "16" in args.rows.split(","):
        for label, total in (("16-row step, all shapes", step), ("16-row step, stacked", stacked_step)):
            print(f"{label:29s} " + " ".join(f"{'-':>14s}" if m != m else f"{m:11.1f} ms" for m in total.values()),
                  flush=True)


def mkl_packed(w: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(``w`` packed by MKL for products of ``rows`` rows, ``w``), or None where this build has no MKL."""
    try:
        return torch.ops.mkl._mkl_reorder_linear_weight(w, rows), w
    except (RuntimeError, AttributeError):
        return None


def reordered(w: torch.Tensor) -> torch.Tensor | None:
    """``w`` in oneDNN's blocked layout, or None where this CPU cannot reorder its format."""
    try:
        return torch.ops.mkldnn._reorder_linear_weight(w, None)
    except RuntimeError:
        return None


if __name__ == "__main__":
    main()
