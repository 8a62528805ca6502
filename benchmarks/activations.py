"""What a training step keeps between forward and backward, and what keeping less costs: one update
of SmolLM2-135M-Instruct (two micro-batches of ``--rows`` rows of ``--tokens`` tokens, bf16 autocast,
fp32 weights and fused AdamW, log-probs and entropies through grouprl's LM head), four ways:

- ``before``: autocast as it comes (its cache keeps each weight's bf16 cast for the whole pass,
  autograd keeps them until backward), the model's own modules;
- ``casts``: the weights' casts made again in backward (:mod:`grouprl.models.casts`);
- ``casts+activations``: and the norms and MLPs keeping fewer activations
  (:mod:`grouprl.models.activations`): what grouprl trains with under ``gradient_checkpointing: false``;
- ``checkpointing``: ``casts`` with every decoder layer checkpointed (``gradient_checkpointing`` on, the
  default).

Peak tensor memory by kind comes from PyTorch's profiler (every allocation, whatever the allocator);
seconds per step are medians over ``--rounds`` rounds taking the four ways in turn. The gradients of
the first three are compared bit for bit.

    python benchmarks/activations.py [--rows 8] [--tokens 108] [--rounds 4] [--threads 2] [--allocator auto]

The last line is ``saved_mib=<before - casts+activations> time_ratio=<casts+activations / before>``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time

import torch
from machine import start_under_allocator  # benchmarks/machine.py: every figure names its CPU
from smoke import add_smoke, policy, shrink

from grouprl.models.activations import keep_fewer_activations
from grouprl.models.casts import lean_casts
from grouprl.rollout.logprobs import token_logprobs
from grouprl.run.logs import peak_tensor_bytes

WAYS = ("before", "casts", "casts+activations", "checkpointing")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8, help="rows per micro-batch (micro_batch_size)")
    parser.add_argument("--tokens", type=int, default=108, help="prompt + completion tokens per row")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--allocator", default="auto", help="as grouprl's allocator setting")
    add_smoke(parser, "the tiny model, 2 rows of 66 tokens, one round")
    args = shrink(parser.parse_args(), rows=2, tokens=66, rounds=1, threads=1)
    start_under_allocator(args.allocator, args.threads)
    base, _ = policy("smollm2-135m", args.smoke, dtype=torch.float32)
    models = {"before": base, "casts": base, "casts+activations": copy.deepcopy(base),
              "checkpointing": copy.deepcopy(base)}
    keep_fewer_activations(models["casts+activations"])
    models["checkpointing"].gradient_checkpointing_enable()
    for m in models.values():
        m.train()
    g = torch.Generator().manual_seed(0)
    completion = 64
    vocab = min(40000, base.config.vocab_size)
    prompt = torch.randint(100, vocab, (args.rows, args.tokens - completion), generator=g)
    tokens = torch.randint(100, vocab, (args.rows, completion), generator=g)
    masks = torch.ones_like(prompt), torch.ones_like(tokens)

    def step(way: str) -> list[torch.Tensor]:
        model = models[way]
        model.zero_grad(set_to_none=True)
        lean = way != "before"
        for _ in range(2):  # two micro-batches: the second runs with the first's gradients held
            with (torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=not lean),
                  lean_casts() if lean else contextlib.nullcontext()):
                logp, entropy = token_logprobs(model, prompt, masks[0], tokens, masks[1], temperature=1.0,
                                               with_entropy=True)
            (logp.sum() + 0.01 * entropy.sum()).backward()
        return [p.grad for p in model.parameters()]

    optimizers = {way: torch.optim.AdamW(models[way].parameters(), lr=0.0, fused=True) for way in WAYS}
    grads, seconds = {}, {way: [] for way in WAYS}
    for r in range(args.rounds + 1):
        for way in WAYS:
            start = time.perf_counter()
            grads[way] = step(way)
            optimizers[way].step()
            if r:  # the first round warms up
                seconds[way].append(time.perf_counter() - start)
    same = {way: all(torch.equal(a, b) for a, b in zip(grads["before"], grads[way])) for way in WAYS[1:3]}
    print(f"\n{args.rows} rows x {args.tokens} tokens per micro-batch, two micro-batches, bf16 autocast, "
          f"{args.threads} threads; peak tensor memory from the profiler (MiB), seconds per update (median of "
          f"{args.rounds})\n")
    print("| way | peak | activations | seconds | gradients equal `before`'s |\n|---|---:|---:|---:|---|")
    peaks = {}
    for way in WAYS:
        peak, kinds = peak_tensor_bytes(lambda w=way: (step(w), optimizers[w].step()))
        peaks[way] = peak / 2**20
        print(f"| {way} | {peaks[way]:.0f} | {kinds['ACTIVATION'] / 2**20:.0f} | "
              f"{statistics.median(seconds[way]):.2f} | {same.get(way, '-')} |")
    ratio = statistics.median(a / b for a, b in zip(seconds["casts+activations"], seconds["before"]))
    print(f"saved_mib={peaks['before'] - peaks['casts+activations']:.0f} time_ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
