"""The LM head's scores (log-prob of the sampled token and entropy per position) with their backward:
grouprl's fused head against autograd through the same formulas under activation checkpointing, side
by side in one process.

SmolLM2-135M-Instruct's head (49152 x 576, tied to the embedding) on ``--positions`` completion
positions in chunks of 256, as a training pass scores them: forward, then backward of the log-probs
plus a small entropy term. Each format is timed as the trainer runs it: ``fp32`` (no autocast) and
``bf16`` (float32 master weights under bf16 autocast, what ``dtype: auto`` picks on CPUs with bf16
units). Both paths are timed ``--repeats`` times in turn; medians, their ratio and the largest
difference of the results are printed.

    python benchmarks/head.py --threads 1

The last line is ``fused_speedup_fp32=<X> fused_speedup_bf16=<Y>`` (checkpointed s / fused s).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
from machine import cpu_line  # benchmarks/machine.py: every figure says which CPU it came from
from smoke import add_smoke, shrink
from smoke import policy as load
from torch import nn

from grouprl.rollout.head import score_chunks

CHUNK = 256


class CheckpointedHead(nn.Linear):
    """Not a plain ``nn.Linear``: ``score_chunks`` takes autograd's checkpointed path for it."""


def run(head: nn.Module, weight: nn.Parameter, feats: torch.Tensor, tokens: torch.Tensor, fmt: str):
    """One forward and backward; (seconds, log-probs, gradient of the features, gradient of the weight)."""
    feats = feats.detach().clone().requires_grad_(True)
    weight.grad = None
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if fmt == "bf16" else contextlib.nullcontext()
    start = time.perf_counter()
    with autocast:
        logp, entropy = score_chunks(head, feats, tokens, 1.0, True, CHUNK)
    (logp.sum() + 0.01 * entropy.sum()).backward()
    return time.perf_counter() - start, logp.detach(), feats.grad, weight.grad.clone()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--positions", type=int, default=656, help="completion positions scored (16 x 41 here)")
    parser.add_argument("--repeats", type=int, default=5)
    add_smoke(parser, "the tiny model, 8 positions, one timing")
    args = shrink(parser.parse_args(), positions=8, repeats=1)
    torch.set_num_threads(args.threads)
    print(cpu_line(), flush=True)
    policy, _ = load("smollm2-135m", args.smoke, dtype=torch.float32)
    weight = policy.lm_head.weight  # tied to the embedding, as in training
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    checkpointed = CheckpointedHead(weight.shape[1], weight.shape[0], bias=False)
    fused.weight = checkpointed.weight = weight
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(args.positions, weight.shape[1], generator=g)
    tokens = torch.randint(0, weight.shape[0], (args.positions,), generator=g)
    speedups = {}
    for fmt in ("fp32", "bf16"):
        times = {"checkpointed": [], "fused": []}
        for head in (checkpointed, fused):
            run(head, weight, feats, tokens, fmt)  # warm-up
        for _ in range(args.repeats):
            for name, head in (("checkpointed", checkpointed), ("fused", fused)):
                times[name].append(run(head, weight, feats, tokens, fmt)[0])
        a, b = run(checkpointed, weight, feats, tokens, fmt), run(fused, weight, feats, tokens, fmt)
        diff = [float((x - y).abs().max() / y.abs().max()) for x, y in zip(a[1:], b[1:])]
        med = {k: statistics.median(v) for k, v in times.items()}
        speedups[fmt] = med["checkpointed"] / med["fused"]
        print(f"{fmt}: {args.positions} positions, forward + backward: checkpointed {med['checkpointed']:.3f} s, "
              f"fused {med['fused']:.3f} s ({speedups[fmt]:.2f}x); largest relative difference: log-probs "
              f"{diff[0]:.1e}, feature grads {diff[1]:.1e}, weight grads {diff[2]:.1e}", flush=True)
    print(f"fused_speedup_fp32={speedups['fp32']:.2f} fused_speedup_bf16={speedups['bf16']:.2f}")


if __name__ == "__main__":
    main()
