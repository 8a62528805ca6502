"""What compiling a decode step gains, the step alone: the built-in engine's layer-loop step
(``grouprl/rollout/cpu/layer_loop.py``) run eagerly and through ``torch.compile`` (inductor, static shapes),
side by side in one process, on SmolLM2-135M-Instruct with the bf16 copies a bf16 rollout decodes with.

A step of a 135M model at a few rows is a few hundred small operators around ~120 matrix products; on a
CPU where the products are fast (bf16 on AMX or AVX-512 BF16) the operators around them cost as much
as the products. Compiling fuses them into a few kernels. Both paths here run every product as
``x @ W.T``, as the engine does, so the difference is what compiling takes off the rest of the step. (The
engine's own compiled steps, ``grouprl/rollout/cpu/compiled.py``, compile with dynamic rows and cache length;
``benchmarks/rollout.py`` times them in whole rollouts.) Both compile with the engine's inductor options (the
vector width stated, so inductor's on-disk cache never hands this run C++ written for another width).

    python benchmarks/compiled_step.py [--threads 2] [--rows 16] [--cached 100] [--format bf16]

Prints milliseconds per step (median of ``--repeats``), the compile time and the largest logit
difference; the last line is ``compiled_speedup=<eager ms / compiled ms>``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from machine import cpu_line  # benchmarks/machine.py: every figure says which CPU it came from
from smoke import add_smoke, policy, shrink

from grouprl.rollout.cpu.compiled import inductor_options
from grouprl.rollout.runner import Runner, positions_from_mask, run_with_bf16_weights


def step_timer(runner: Runner, rows: int, cached: int, repeats: int):
    """(a function running one decode step after ``cached`` positions, a function timing one given it)."""
    loop, cache = runner._loop, runner.cache
    token = torch.randint(0, min(1000, runner.model.config.vocab_size), (rows, 1))
    mask = torch.ones(rows, cached + 1, dtype=torch.long)
    position = torch.full((rows, 1), cached)

    def step(fn):
        for layer in cache.layers:  # the same position rewritten each call: the same shapes every time
            layer.length = cached
        return fn(token, mask, position, cache)

    def timed(fn) -> float:
        for _ in range(3):
            step(fn)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            step(fn)
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    assert loop is not None, "the layer loop covers SmolLM2"
    return step, timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--cached", type=int, default=100, help="positions in the KV cache before the step")
    parser.add_argument("--format", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--repeats", type=int, default=20)
    add_smoke(parser, "the tiny model, 2 rows, 4 cached positions, fp32, one timing")
    args = shrink(parser.parse_args(), rows=2, cached=4, format="fp32", repeats=1, threads=1)
    torch.set_num_threads(args.threads)
    print(cpu_line(), f"threads {args.threads}, {args.rows} rows, {args.cached} cached positions, {args.format}",
          flush=True)
    model, _ = policy("smollm2-135m", args.smoke, dtype=torch.float32)

    def measure(m):
        runner = Runner(m, capacity=args.cached + 8)
        ids = torch.randint(0, min(1000, m.config.vocab_size), (args.rows, args.cached))
        mask = torch.ones_like(ids)
        runner.forward(ids, mask, positions_from_mask(mask))
        step, timed = step_timer(runner, args.rows, args.cached, args.repeats)
        eager = timed(runner._loop.step)
        compiled_fn = torch.compile(runner._loop.step, dynamic=False, options=inductor_options())
        start = time.perf_counter()
        step(compiled_fn)
        compile_s = time.perf_counter() - start
        compiled = timed(compiled_fn)
        diff = (step(compiled_fn) - step(runner._loop.step)).abs().max().item()
        return eager, compiled, compile_s, diff

    with torch.inference_mode():
        if args.format == "bf16":
            eager, compiled, compile_s, diff = run_with_bf16_weights(model, measure)
        else:
            eager, compiled, compile_s, diff = measure(model)
    print(f"eager step {eager:.1f} ms, compiled step {compiled:.1f} ms (compiled in {compile_s:.0f} s); "
          f"largest logit difference {diff:.3g}")
    print(f"compiled_speedup={eager / compiled:.2f}")


if __name__ == "__main__":
    main()
