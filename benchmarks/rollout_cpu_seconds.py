"""Built-in engine rollouts per CPU-second: a figure that other jobs on the machine barely move.

On a shared 2-core machine the wall time of a rollout swings by several times with the load; the CPU time of a
one-thread rollout does not (the process is charged only while it runs). Comparing two source trees by it, their
runs taken in turn, answers "did this change make decoding slower" where wall-clock benchmarks cannot:

    for pair in 1 2 3 4 5; do for tree in /path/to/before /path/to/after; do
      PYTHONPATH=$tree/src python benchmarks/rollout_cpu_seconds.py --label $tree-$pair
    done; done

The bundled SmolLM2-135M-Instruct in fp32, one torch thread, ``--rows`` rows (arithmetic prompts x G=4) of at most
``--tokens`` new tokens at temperature 1, seeds 0, 1, ...; ``--warmup`` rollouts first (the sampler's first
calls), then ``--repeats`` timed ones. Prints the completion tokens (the same in every run of one tree when its
decoding is deterministic), tokens per CPU-second and tokens per wall second. It uses only the sampler's public
call, so it runs on older trees as well.
"""

from __future__ import annotations

import argparse
import time

import torch
from smoke import add_smoke, policy, shrink


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", default="run")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    add_smoke(ap, "the tiny model, 4 rows (one prompt x G=4) of 4 tokens, one warm-up and one timed rollout")
    a = shrink(ap.parse_args(), rows=4, tokens=4, warmup=1, repeats=1)
    torch.set_num_threads(1)
    from grouprl.rollout.sampler import Sampler
    from grouprl.types import SamplingParams

    group = 4
    model, tokenizer = policy("smollm2-135m", a.smoke, dtype=torch.float32)
    model.eval()
    texts = [f"What is {7 + i}+{(3 * i) % 10 + 1}? Answer with just the number." for i in range(a.rows // group)]
    ids = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True) for t in texts]
    ids = [x if isinstance(x, list) else x["input_ids"] for x in ids]
    sampler = Sampler(model, tokenizer)
    params = SamplingParams(max_new_tokens=a.tokens, temperature=1.0, format="fp32")
    tokens = cpu = wall = 0.0
    with torch.no_grad():
        for seed in range(a.warmup + a.repeats):
            c0, w0 = time.process_time(), time.perf_counter()
            batch = sampler.generate(ids, group, params, seed=seed)
            c1, w1 = time.process_time(), time.perf_counter()
            if seed >= a.warmup:
                tokens, cpu, wall = tokens + int(batch.lengths.sum()), cpu + c1 - c0, wall + w1 - w0
    print(f"{a.label} tokens={int(tokens)} tok_per_cpu_s={tokens / cpu:.2f} tok_per_wall_s={tokens / wall:.2f}",
          flush=True)


if __name__ == "__main__":
    main()
