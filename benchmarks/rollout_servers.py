"""Rollout servers (grouprl.serve) against the in-process vLLM engine: how long a server takes to start, a
rollout's tokens/s through one server beside the in-process engine's, and what a weight sync costs.

    python benchmarks/rollout_servers.py [--model smollm2-135m|tiny64] [--dtype fp32|bf16] [--rows 16]
                                         [--tokens 64] [--repeats 3] [--syncs 3] [--no_in_process]

One server is started the way ``rollout_servers: 1`` starts it (pinned to this process's cores, here all
of them, since the two engines take turns); its start is timed from the process's launch to its first
answer (the model loaded and written by grouprl, then vLLM's start). Rollouts are arithmetic prompts x
G=4 samples at temperature 1 with per-row seeds, taken in turn by the server and the in-process engine
(``--repeats`` each, after one warm-up each), so load from other jobs falls on both; tokens/s counts
completion tokens up to and including EOS over the wall time of ``generate``. A sync is
``update_weights`` + the push before the next rollout: weights written as safetensors to /dev/shm, then
loaded in place by the server; ``--syncs`` of them are timed. tiny64 is the tests' random 2-layer Llama
with head size 64 (vLLM's CPU attention takes no smaller head). On a machine shared with other jobs the
timings swing from run to run: compare figures from one run.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from machine import cpu_line  # benchmarks/machine.py: every figure names its CPU
from smoke import add_smoke, shrink

from grouprl.rollout.sampler import Sampler
from grouprl.serve.client.server_sampler import ServerSampler
from grouprl.serve.weights.transport import reading, write_model_folder
from grouprl.trainer.local_servers import LocalServers
from grouprl.types import SamplingParams

G = 4


def load(name: str):
    if name == "tiny64":
        from grouprl.models import tiny_causal_lm

        return tiny_causal_lm(seed=0, hidden_size=128, num_heads=2, num_kv_heads=2)
    from grouprl.models import load_policy

    return load_policy(name)


def prompts(rows: int) -> list[str]:
    return [f"What is {a}+{b}? Answer with just the number." for a, b in
            [(7 + i, (3 * i) % 10 + 1) for i in range(rows // G)]]


def rollout(engine, ids, tokens: int, seed: int) -> tuple[int, float]:
    params = SamplingParams(max_new_tokens=tokens, temperature=1.0)
    start = time.perf_counter()
    batch = engine.generate(ids, G, params, seed=list(range(seed * 1000, seed * 1000 + len(ids) * G)))
    return int(batch.lengths.sum()), time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--syncs", type=int, default=3)
    p.add_argument("--no_in_process", action="store_true", help="skip the in-process engine")
    add_smoke(p, "the tiny model with 64-dimension heads, one server, 4 rows (one prompt x G=4) x 4 tokens, one "
              "rollout and one sync, no in-process engine")
    a = shrink(p.parse_args(), model="tiny64", rows=4, tokens=4, repeats=1, syncs=1, no_in_process=True)
    print(cpu_line(), flush=True)
    model, tok = load(a.model)
    ids = Sampler(model, tok).encode(prompts(a.rows))
    length = max(map(len, ids)) + a.tokens
    folder = Path(tempfile.mkdtemp(prefix="bench-model-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    write_model_folder(model, tok, folder, reading(model))
    logs = Path(tempfile.mkdtemp(prefix="bench-servers-"))
    start = time.perf_counter()
    local = LocalServers(1, folder, ["--rollout_dtype", a.dtype, "--max_model_len", str(length), "--max_rows",
                                     str(a.rows)], logs)
    client = ServerSampler(model, tok, local.addresses, timeout=1200, local=local, token=local.token)
    print(f"server start: {time.perf_counter() - start:.1f} s ({a.model}, {a.dtype}; log {logs}/server-0.log)",
          flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    engines = {"server": client}
    if not a.no_in_process:
        from grouprl.rollout.vllm import VLLMSampler

        start = time.perf_counter()
        engines["in-process vLLM"] = VLLMSampler(model, tok, max_model_len=length,
                                                 dtype={"fp32": "float32", "bf16": "bfloat16"}[a.dtype],
                                                 max_rows=a.rows * G)
        print(f"in-process engine start: {time.perf_counter() - start:.1f} s", flush=True)
    try:
        totals = {name: [0, 0.0] for name in engines}
        for engine in engines.values():  # warm-up, and the first weight push
            rollout(engine, ids, a.tokens, seed=99)
        for r in range(a.repeats):
            for name, engine in engines.items():
                n, s = rollout(engine, ids, a.tokens, seed=r)
                totals[name][0] += n
                totals[name][1] += s
        for name, (n, s) in totals.items():
            print(f"{a.rows} x {a.tokens} {a.dtype}, {name}: {n / s:.1f} tokens/s ({n} tokens in {s:.2f} s)",
                  flush=True)
        client.metrics()
        times = []
        for _ in range(a.syncs):
            with torch.no_grad():
                for q in model.parameters():
                    q.mul_(1.0 + 1e-4)
            client.update_weights(model)
            start = time.perf_counter()
            client.sync_weights()
            times.append(time.perf_counter() - start)
        print(f"weight sync ({a.model}, {a.dtype}): " + ", ".join(f"{t:.2f}" for t in times)
              + f" s; mean {sum(times) / len(times):.2f} s", flush=True)
    finally:
        client.close()
        for engine in engines.values():
            if engine is not client:
                engine.close()


if __name__ == "__main__":
    sys.exit(main())
