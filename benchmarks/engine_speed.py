"""The built-in engine's tokens/s once its decode layouts have settled: one number per run, for comparing
two versions of the engine from their own checkouts, in turn.

SmolLM2-135M-Instruct, ``benchmarks/rollout.py``'s arithmetic prompts x G=4, temperature 1, stopping on
EOS; ``--warmup`` whole rollouts first (the learnt layouts decide within them), then ``--timed`` rollouts
of further seeds, their completion tokens over their seconds.

    python benchmarks/engine_speed.py [--rows 16] [--new_tokens 64] [--format bf16] [--threads 2] [--compile]
    git worktree add /tmp/before REV && PYTHONPATH=/tmp/before/src python benchmarks/engine_speed.py  # the other

``--compile`` runs the engine with its compiled decode steps (``rollout_compile``), compiled within the warm-up
rollouts, and prints how long compiling took (``TORCHINDUCTOR_CACHE_DIR=$(mktemp -d)`` in front times a compile
with nothing cached). The last line is ``tokens_per_s=<X>``.
"""

from __future__ import annotations

import argparse
import time

import torch
from machine import start_under_allocator  # benchmarks/machine.py: every figure names its CPU
from rollout import G, prompts
from smoke import add_smoke, policy, shrink

from grouprl.rollout.sampler import Sampler
from grouprl.types import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--format", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--timed", type=int, default=6)
    parser.add_argument("--allocator", default="auto", help="as grouprl's allocator setting")
    parser.add_argument("--compile", action="store_true", help="the compiled decode steps (rollout_compile)")
    add_smoke(parser, "the tiny model, 4 rows (one prompt x G=4) of 4 new tokens, fp32, one warm-up and one timing")
    args = shrink(parser.parse_args(), rows=4, new_tokens=4, format="fp32", threads=1, warmup=1, timed=1)
    start_under_allocator(args.allocator, args.threads)  # as the grouprl command starts itself
    model, tokenizer = policy("smollm2-135m", args.smoke, dtype=torch.float32)
    sampler = Sampler(model, tokenizer, compile_steps=args.compile)
    ids = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
           for p in prompts(args.rows)]
    ids = [i if isinstance(i, list) else i["input_ids"] for i in ids]
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, format=args.format)
    for seed in range(args.warmup):
        sampler.generate(ids, G, params, seed=seed)
    tokens, seconds = 0, 0.0
    for seed in range(args.warmup, args.warmup + args.timed):
        start = time.perf_counter()
        batch = sampler.generate(ids, G, params, seed=seed)
        seconds += time.perf_counter() - start
        tokens += int(batch.lengths.sum())
    print(f"{args.rows} rows x {args.new_tokens} new tokens, {args.format}, {args.threads} threads: "
          f"{tokens} tokens in {seconds:.2f} s")
    if sampler.compiled is not None:
        step = sampler.compiled
        print(f"compiled steps: compiling took {step.compile_seconds:.1f} s; {step.steps} steps compiled, "
              f"{step.refused} refused{', ' + step.unsupported if step.unsupported else ''}")
    print(f"tokens_per_s={tokens / seconds:.1f}")


if __name__ == "__main__":
    main()
