"""Where a built-in engine rollout's time goes: each decode step timed by the rows still running, the prefill
and the draw, on the bundled SmolLM2-135M-Instruct at ``benchmarks/rollout.py``'s 16 x 64 setting (its
arithmetic prompts x G=4, temperature 1, EOS only), after ``--warmup`` whole rollouts (the learnt layouts
settle and the compiled step compiles in them).

    python benchmarks/decode_steps.py [--format bf16] [--compile true] [--rows 16] [--repeats 4] [--threads 2]
    python benchmarks/decode_steps.py --profile 12   # also PyTorch's profiler: the 12 costliest operators
    TORCHINDUCTOR_CPP_WRAPPER=1 python benchmarks/decode_steps.py   # inductor's C++ wrapper around the graph

Prints per running-row count the steps and milliseconds a step, the prefill's and the draw's milliseconds,
and the share of the rollouts' time they account for; with ``--profile``, the operators by self time
divided by the steps (the profiler's own cost is in them: read the shares). The last line is
``tokens_per_s=<completion tokens over seconds of the timed rollouts>``.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections import defaultdict

import torch
from machine import start_under_allocator  # benchmarks/machine.py: every figure says which CPU it came from
from rollout import G, prompts
from smoke import add_smoke, policy, shrink

from grouprl.rollout import decoding
from grouprl.rollout.runner import Runner
from grouprl.rollout.sampler import Sampler
from grouprl.types import SamplingParams


def timed(records: list[tuple[str, int, float]]):
    """Wrap ``Runner.forward`` and the decode loop's draw so each call appends (kind, rows, seconds)."""
    forward, pick = Runner.forward, decoding.pick_tokens

    def timed_forward(self, ids, mask, positions):
        start = time.perf_counter()
        out = forward(self, ids, mask, positions)
        records.append(("prefill" if ids.shape[1] > 1 else "step", ids.shape[0], time.perf_counter() - start))
        return out

    def timed_pick(logits, *args, **kwargs):
        start = time.perf_counter()
        out = pick(logits, *args, **kwargs)
        records.append(("draw", logits.shape[0], time.perf_counter() - start))
        return out

    Runner.forward, decoding.pick_tokens = timed_forward, timed_pick


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", default="bf16", choices=("fp32", "bf16", "bf16-weights"))
    parser.add_argument("--compile", default="true", choices=("true", "false"), help="rollout_compile")
    parser.add_argument("--rows", type=int, default=16, help="rows (prompts x G=4)")
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", type=int, default=0, help="operators to list from PyTorch's profiler (0: none)")
    add_smoke(parser, "the tiny model, 4 rows (one prompt x G=4) of 4 new tokens, fp32, not compiled, one warm-up "
                      "and one timing")
    args = shrink(parser.parse_args(), format="fp32", compile="false", rows=4, new_tokens=4, warmup=1, repeats=1,
                  threads=1)
    start_under_allocator("auto", args.threads)
    model, tokenizer = policy("smollm2-135m", args.smoke, dtype=torch.float32)
    sampler = Sampler(model, tokenizer, compile_steps=args.compile == "true")
    ids = sampler.encode(prompts(args.rows))
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, format=args.format)
    for seed in range(args.warmup):
        sampler.generate(ids, G, params, seed=1000 + seed)
    records: list[tuple[str, int, float]] = []
    timed(records)
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if args.profile else None
    tokens, seconds = 0, 0.0
    with profiler or contextlib.nullcontext():
        for seed in range(args.repeats):
            start = time.perf_counter()
            tokens += int(sampler.generate(ids, G, params, seed=seed).lengths.sum())
            seconds += time.perf_counter() - start
    report(records, seconds, sampler, args)
    if profiler is not None:
        steps = sum(kind == "step" for kind, _, _ in records)
        ops = sorted(profiler.key_averages(), key=lambda e: -e.self_cpu_time_total)[:args.profile]
        total = sum(e.self_cpu_time_total for e in profiler.key_averages())
        print(f"operators by self time, over {steps} steps (profiler's cost included):")
        for e in ops:
            print(f"  {e.key[:60]:60s} {e.self_cpu_time_total / 1e3 / steps:7.2f} ms a step  "
                  f"{e.self_cpu_time_total / total:5.1%}  {e.count / steps:6.1f} calls a step")
    print(f"tokens_per_s={tokens / seconds:.1f}")


def report(records: list[tuple[str, int, float]], seconds: float, sampler: Sampler, args) -> None:
    by_rows: dict[tuple[str, int], list[float]] = defaultdict(list)
    for kind, rows, took in records:
        by_rows[kind, rows if kind == "step" else 0].append(took)
    compiled = sampler.compiled
    print(f"{args.rows} rows x {args.new_tokens} new tokens, {args.format}, compile {args.compile} "
          f"({compiled.steps if compiled else 0} steps compiled), {args.repeats} rollouts, {seconds:.2f} s:")
    for (kind, rows), times in sorted(by_rows.items()):
        label = f"step of {rows:2d} rows" if kind == "step" else kind
        print(f"  {label:16s} {len(times):4d} calls  {sum(times) / len(times) * 1e3:7.2f} ms each  "
              f"{sum(times) / seconds:5.1%} of the time")
    accounted = sum(took for _, _, took in records)
    print(f"  accounted for: {accounted / seconds:.1%} (the rest: weight copies, setup, finishing)")


if __name__ == "__main__":
    main()
