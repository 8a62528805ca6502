"""Few-row matrix products at SmolLM2-135M's decoding shapes, one way per line: ``x @ W.T`` (what
``nn.Linear`` does), ``(W @ x.T).T`` (the other layout the built-in engine may learn to use,
``grouprl/rollout/skinny.py``), bf16 ``x @ W.T``, and PyTorch's weight-only int8 kernel
(``torch.ops.aten._weight_int8pack_mm``, bf16 activations), which reads a quarter of fp32's weight bytes.

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

SHAPES = {"q, o (576 x 576)": (576, 576, 60), "k, v (192 x 576)": (192, 576, 60),
          "gate, up (1536 x 576)": (1536, 576, 60), "down (576 x 1536)": (576, 1536, 30),
          "LM head (49152 x 576)": (49152, 576, 1)}
"""name -> (output size, input size, how many such weights a decode step reads)."""


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
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(cpu_line(), f"threads {args.threads}", flush=True)
    ways = {
        "x @ W.T": lambda w, x: torch.nn.functional.linear(x, w["fp32"]),
        "(W @ x.T).T": lambda w, x: torch.mm(w["fp32"], x.t()).t(),
        "bf16 x @ W.T": lambda w, x: torch.nn.functional.linear(x.bfloat16(), w["bf16"]),
        "int8 weights": lambda w, x: torch.ops.aten._weight_int8pack_mm(x.bfloat16(), w["int8"], w["scales"]),
    }
    print(f"{'shape':24s} {'rows':>4s} " + " ".join(f"{k:>13s}" for k in ways), flush=True)
    for name, (out, inp, count) in SHAPES.items():
        weights = []
        for _ in range(count):
            w = torch.randn(out, inp)
            scales = w.abs().amax(1) / 127
            weights.append({"fp32": w, "bf16": w.bfloat16(), "scales": scales.bfloat16(),
                            "int8": (w / scales[:, None]).round().clamp(-128, 127).to(torch.int8)})
        repeats = 3 if count == 1 else 5
        for rows in map(int, args.rows.split(",")):
            x = torch.randn(rows, inp)
            ms = [per_call_ms(fn, weights, x, repeats) for fn in ways.values()]
            print(f"{name:24s} {rows:4d} " + " ".join(f"{m:10.3f} ms" for m in ms), flush=True)


if __name__ == "__main__":
    main()
