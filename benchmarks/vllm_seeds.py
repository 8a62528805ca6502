"""What grouprl's per-row seeds cost vLLM, and what stopping at EOS costs it: raw vLLM ``generate``
on grouprl's engine (the bundled SmolLM2-135M-Instruct, bf16, the trainer's weights pushed), the
rollout benchmark's prompts x G=4, temperature 1, with a seed per request (what grouprl sends, so a
row's completion does not depend on the rest of the batch) or none, stopping at EOS or ignoring it.

    python benchmarks/vllm_seeds.py [--rows 64] [--new_tokens 128] [--threads 2] [--repeats 2]

Each of the four ways runs in turn, ``--repeats`` times; tokens/s is the total over the repeats. The
last line is ``seeded_over_unseeded=<X> eos_over_ignore_eos=<Y>`` (with EOS, seeded).
"""

from __future__ import annotations

import argparse

import torch
from machine import start_under_allocator  # benchmarks/machine.py: every figure names its CPU
from rollout import G, finished, prompts
from smoke import add_smoke, policy, shrink


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64, help="prompts x G=4")
    parser.add_argument("--new_tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--allocator", default="auto", help="as grouprl's allocator setting")
    add_smoke(parser, "the tiny model with 64-dimension heads, 4 rows x 4 new tokens, one timing")
    args = shrink(parser.parse_args(), rows=4, new_tokens=4, repeats=1, threads=1)
    start_under_allocator(args.allocator, args.threads)
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from grouprl.rollout.vllm import VLLMSampler

    model, tok = policy("smollm2-135m", args.smoke, for_vllm=True, dtype=torch.float32)
    engine = VLLMSampler(model, tok, max_model_len=args.new_tokens + 64, dtype="bfloat16", max_rows=args.rows)
    engine.sync_weights()
    requests = [TokensPrompt(prompt_token_ids=tok(p)["input_ids"]) for p in prompts(args.rows) for _ in range(G)]

    def run(seeded: bool, ignore_eos: bool, n: int) -> tuple[int, float]:
        params = [SamplingParams(temperature=1.0, max_tokens=n, seed=1000 + k if seeded else None, logprobs=0,
                                 ignore_eos=ignore_eos) for k in range(len(requests))]
        start = finished()
        out = engine.llm.generate(requests, params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in out), finished() - start

    ways = [(seeded, ignore) for seeded in (True, False) for ignore in (False, True)]
    for way in ways:  # warm-up
        run(*way, 4)
    totals = {way: [0, 0.0] for way in ways}
    for _ in range(args.repeats):
        for way in ways:
            tokens, seconds = run(*way, args.new_tokens)
            totals[way][0] += tokens
            totals[way][1] += seconds
    rate = {way: t / s for way, (t, s) in totals.items()}
    print(f"{args.rows} rows x {args.new_tokens} new tokens, bf16, {args.threads} threads (tokens/s):")
    for (seeded, ignore), r in rate.items():
        print(f"  {'seed per row' if seeded else 'no seeds':12s}  {'EOS ignored' if ignore else 'stop at EOS':11s}"
              f"  {r:7.1f}  ({totals[seeded, ignore][0]} tokens)")
    engine.close()
    print(f"seeded_over_unseeded={rate[True, False] / rate[False, False]:.2f} "
          f"eos_over_ignore_eos={rate[True, False] / rate[True, True]:.2f}")


if __name__ == "__main__":
    main()
