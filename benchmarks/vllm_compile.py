"""vLLM's CPU engine eager (grouprl's setting) against compiled (torch.compile of the model, vLLM's own
default): what compiling costs at start and gains in decoding, and whether a weight push still reaches
the compiled engine.

Both engines are grouprl's ``VLLMSampler`` on the bundled SmolLM2-135M-Instruct, bf16, built in one
process; compiled mode is ``vllm_compile`` (vLLM's ``enforce_eager=False``). Start: seconds from construction to the end
of a first 4-token rollout (vLLM compiles on its first calls). Decoding: ``--rows`` rows (prompts x G=4)
of up to ``--new_tokens`` tokens at temperature 1, stopping at EOS, the two engines in turn with the
same seeds, ``--repeats`` times; medians. Push: the policy's weights get noise of 5% of their mean size
and are pushed to both engines; the eager engine's greedy completion must change, and the compiled
engine's must equal it (the policy's own fp32 greedy completion is printed beside them).

    python benchmarks/vllm_compile.py --threads 1

The last line is ``compiled_speedup=<X> extra_start_s=<Y> push_followed=<true/false>``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from machine import cpu_line  # benchmarks/machine.py: every figure says which CPU it came from
from rollout import G, prompts
from smoke import add_smoke, policy, shrink

from grouprl.rollout.sampler import Sampler
from grouprl.types import SamplingParams


def build(model, tokenizer, eager: bool, longest: int, rows: int):
    """A bf16 ``VLLMSampler``, compiled unless ``eager``; (sampler, the time its construction started)."""
    from grouprl.rollout.vllm import VLLMSampler

    start = time.perf_counter()
    return VLLMSampler(model, tokenizer, max_model_len=longest, dtype="bfloat16", max_rows=rows,
                       compiled=not eager), start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=4)
    add_smoke(parser, "the tiny model with 64-dimension heads, 4 rows x 4 new tokens, one timing")
    args = shrink(parser.parse_args(), rows=4, new_tokens=4, repeats=1)
    torch.set_num_threads(args.threads)
    print(cpu_line(), flush=True)
    model, tokenizer = policy("smollm2-135m", args.smoke, for_vllm=True, dtype=torch.float32)
    ids = Sampler(model, tokenizer).encode(prompts(max(G, args.rows)))
    engines, starts = {}, {}
    for mode in ("eager", "compiled"):
        engine, start = build(model, tokenizer, mode == "eager", args.new_tokens + 64, len(ids) * G)
        engine.generate(ids, G, SamplingParams(max_new_tokens=4, temperature=1.0), seed=0)
        engines[mode], starts[mode] = engine, time.perf_counter() - start
        print(f"{mode}: start {starts[mode]:.1f} s", flush=True)
    rates = {mode: [] for mode in engines}
    for seed in range(args.repeats):
        for mode, engine in engines.items():
            start = time.perf_counter()
            batch = engine.generate(ids, G, SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0), seed=seed)
            rates[mode].append(int(batch.lengths.sum()) / (time.perf_counter() - start))
    median = {mode: statistics.median(r) for mode, r in rates.items()}
    print(f"{len(ids) * G} rows x {args.new_tokens} new tokens, bf16: eager {median['eager']:.1f} tokens/s, "
          f"compiled {median['compiled']:.1f} tokens/s", flush=True)

    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)

    def answers() -> dict[str, list[int]]:
        out = {}
        for mode, engine in engines.items():
            batch = engine.generate(ids[:1], 1, greedy, seed=0)
            out[mode] = batch.completion_ids[0, : int(batch.lengths[0])].tolist()
        return out

    before = answers()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a change of a few percent, so that the greedy answer moves
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05 * p.abs().mean())
    for engine in engines.values():
        engine.update_weights(model)  # pushed before its next rollout
    after = answers()
    own = Sampler(model, tokenizer).generate(ids[:1], 1, greedy, seed=0)
    own = own.completion_ids[0, : int(own.lengths[0])].tolist()
    followed = after["eager"] != before["eager"] and after["compiled"] == after["eager"]
    print(f"greedy completion before the push: eager {before['eager']}, compiled {before['compiled']}", flush=True)
    print(f"after: eager {after['eager']}, compiled {after['compiled']}, the policy itself (fp32) {own}", flush=True)
    print(f"compiled_speedup={median['compiled'] / median['eager']:.2f} "
          f"extra_start_s={starts['compiled'] - starts['eager']:.0f} push_followed={str(followed).lower()}")


if __name__ == "__main__":
    main()
