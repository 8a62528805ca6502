"""Padded against packed log-prob passes on one real GRPO batch, side by side in one process.

One rollout of SmolLM2-135M-Instruct (4 arithmetic prompts x G=4, up to 64 new tokens,
temperature 1) is scored by ``grouprl.rollout.logprobs.token_logprobs`` in both layouts, in turn:
the training pass (forward with grad, then backward) and the reference pass (no grad). Each is
timed ``--repeats`` times per layout, alternating; the medians and their ratios are printed, and
the largest log-prob difference between the layouts as a check that both compute the same thing.

    python benchmarks/packing.py --threads 1

The last line is ``train_speedup=<padded s over packed s> reference_speedup=<same, no grad>``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from machine import cpu_line  # benchmarks/machine.py: every figure says which CPU it came from
from smoke import add_smoke, policy, shrink

from grouprl.rollout.logprobs import token_logprobs
from grouprl.rollout.sampler import Sampler
from grouprl.types import SamplingParams

PROMPTS = [f"What is {a}+{b}? Answer with just the number." for a, b in ((7, 5), (3, 9), (12, 4), (8, 8))]
G = 4


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    add_smoke(parser, "the tiny model, one timing")
    args = shrink(parser.parse_args(), repeats=1)
    print(cpu_line(), flush=True)
    torch.set_num_threads(args.threads)
    model, tokenizer = policy("smollm2-135m", args.smoke, dtype=torch.float32)
    sampler = Sampler(model, tokenizer)
    batch = sampler.generate(sampler.encode(PROMPTS), G, SamplingParams(max_new_tokens=64, temperature=1.0),
                             seed=args.seed)
    inputs = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
    lengths = batch.completion_mask.sum(-1)
    print(f"{batch.batch_size} rows, prompts of {int(batch.prompt_mask.sum(-1).max())} tokens, completions "
          f"{lengths.float().mean():.1f} tokens on average (at most {int(lengths.max())}); {args.threads} thread(s)")

    def train(packed: bool) -> None:
        model.zero_grad(set_to_none=True)
        logp, _ = token_logprobs(model, *inputs, packed=packed)
        logp.sum().backward()

    def reference(packed: bool) -> None:
        with torch.no_grad():
            token_logprobs(model, *inputs, packed=packed)

    with torch.no_grad():
        gap = (token_logprobs(model, *inputs, packed=True)[0] - token_logprobs(model, *inputs)[0]).abs().max()
    print(f"largest log-prob difference between the layouts: {gap:.2e}")
    train(False), train(True)  # warm-up: first-call allocations
    seconds = {(kind, packed): [] for kind in ("train", "reference") for packed in (False, True)}
    for _ in range(args.repeats):
        for packed in (False, True):
            seconds[("train", packed)].append(timed(train, packed))
            seconds[("reference", packed)].append(timed(reference, packed))
    ratios = {}
    for kind in ("train", "reference"):
        padded, packed = (statistics.median(seconds[(kind, p)]) for p in (False, True))
        ratios[kind] = padded / packed
        print(f"{kind:9s} padded {padded:6.2f} s  packed {packed:6.2f} s  -> {ratios[kind]:.2f}x")
    print(f"train_speedup={ratios['train']:.2f} reference_speedup={ratios['reference']:.2f}")


if __name__ == "__main__":
    main()
