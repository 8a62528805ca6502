"""A GRPO step on a 2-core CPU: synchronous in one process against a rollout server at max_staleness 0 and 1.

    python benchmarks/async_step.py [--model smollm2-135m] [--prompts 8] [--group 8] [--tokens 128]
                                    [--warmup 1] [--steps 3] [--only colocated,k0,k1]

Three runs of the arithmetic task, each in a process of its own, one after the other, same seed:

- colocated: the default engine in the trainer's process (rollout_engine auto), 2 threads on both cores;
  sample, then update;
- k0: one ``grouprl serve`` pinned to core 0 (vLLM's threads bound there), the trainer pinned to core 1 with
  1 thread; sample, then update (max_staleness 0);
- k1: the same with max_staleness 1: the server samples step t+1 while the trainer updates on step t.

A step's time is the wall time of the measured steps (after ``--warmup`` steps: compiling, the first push, the
pipeline filling) over their number; one more step follows them, unmeasured, so that at k1 every measured step
has the server sampling the next batch (the last step of a run has nothing left to sample). The trainer's idle
share is the time its thread waited on the server
(``time/rollout`` at k0, ``time/trainer_idle`` at k1) over the wall time; the server's is 1 minus
``server/0/busy`` (the share of the time a request was in flight). The phase times (rollout, log-probs,
update, weight writing and loading) are per step, for the model in docs/async.md. Held-out evaluation and
checkpoints are off. Absolute times move with the machine's load (other jobs share these cores): compare the
runs of one invocation. The last line is the ratio of k1's steps per second to colocated's.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_line  # benchmarks/machine.py: every figure names its CPU
from smoke import add_smoke, shrink, tiny_folder

RUNS = ("colocated", "k0", "k1")
PHASES = ("rollout", "reward", "logprobs", "update", "weight_write", "weight_sync", "trainer_idle")


def config_for(a: argparse.Namespace, out: Path, threads: int):
    from grouprl.config import TrainConfig

    return TrainConfig(model=a.model, task="arithmetic", prompts_per_step=a.prompts, group_size=a.group,
                       max_new_tokens=a.tokens, total_steps=a.warmup + a.steps + 1, eval_size=0, output_dir=str(out),
                       progress=False, log_completions_every=0, seed=0, num_threads=threads)


def start_server(config, policy, tokenizer, out: Path):
    """One server on core 0 in the run's formats; this process then keeps to core 1."""
    from grouprl.models.precision import pinned, resolve_formats
    from grouprl.serve.weights.transport import reading, write_model_folder
    from grouprl.trainer.local_servers import LocalServers
    from grouprl.trainer.rollout_servers import serve_options

    formats = resolve_formats(config.dtype, config.ref_dtype, config.rollout_dtype, None)
    config = dataclasses.replace(config, **pinned(formats))
    folder = Path(tempfile.mkdtemp(prefix="bench-model-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    try:
        write_model_folder(policy, tokenizer, folder, reading(policy))
        local = LocalServers(1, folder, serve_options(config, 512), out / "servers", cores=[0])
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    os.sched_setaffinity(0, {1})
    return config, local, folder  # the folder stays until the server has loaded it (the trainer waits for that)


def one_run(a: argparse.Namespace) -> dict:
    """The run ``a.run`` in this process: per-step metrics and the measured wall time."""
    import torch

    from grouprl.cli.build import build_inputs, load_model
    from grouprl.trainer.trainer import Trainer

    out = Path(a.out)
    served = a.run != "colocated"
    config = config_for(a, out, 1 if served else 2)
    inputs = build_inputs(config)
    policy, tokenizer = load_model(config.model, config.seed)
    local = folder = None
    if served:
        config, local, folder = start_server(config, policy, tokenizer, out)
        config = dataclasses.replace(config, rollout_servers=tuple(local.addresses), max_staleness=int(a.run[1:]),
                                     rollout_server_timeout=1800.0, rollout_server_token=local.token)
    torch.set_num_threads(config.num_threads)
    try:
        trainer = Trainer(config, policy=policy, tokenizer=tokenizer, inputs=inputs)
    except BaseException:
        if local is not None:
            local.stop()
        raise
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    steps, ends = [], []
    try:
        for _ in range(config.total_steps):
            metrics, _ = trainer.step()
            trainer.step_count += 1
            steps.append(metrics)
            ends.append(time.perf_counter())
            print(f"  {a.run} step {trainer.step_count}: {metrics['time/step']:.1f} s", file=sys.stderr, flush=True)
    finally:
        trainer.close()
        if local is not None:
            local.stop()
    last = a.warmup + a.steps  # the trailing step is not measured: each measured one samples its successor
    return {"run": a.run, "setup": trainer.setup, "steps": steps[a.warmup:last],
            "wall": ends[last - 1] - ends[a.warmup - 1]}


def summary(result: dict) -> dict[str, float]:
    steps, n = result["steps"], len(result["steps"])
    mean = {p: sum(s.get(f"time/{p}", 0.0) for s in steps) / n for p in PHASES}
    wall = result["wall"] / n
    waited = mean["trainer_idle"] if result["run"] == "k1" else mean["rollout"] if result["run"] == "k0" else 0.0
    busy = [s["server/0/busy"] for s in steps if "server/0/busy" in s]
    return {**mean, "step_s": wall, "steps_per_s": 1 / wall, "trainer_idle_share": waited / wall,
            "server_idle_share": 1 - sum(busy) / len(busy) if busy else float("nan")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--only", default=",".join(RUNS), help="which runs, of " + ", ".join(RUNS))
    p.add_argument("--run", choices=RUNS, help=argparse.SUPPRESS)  # a child process: this run only
    p.add_argument("--out", help=argparse.SUPPRESS)
    add_smoke(p, "colocated and k1 (colocated alone where vLLM is not installed), the tiny model with 64-dimension "
              "heads, 1 prompt x 2 samples x 4 tokens, one warm-up and one measured step")
    served = importlib.util.find_spec("vllm") is not None
    a = shrink(p.parse_args(), model=lambda: tiny_folder(tempfile.mkdtemp(prefix="async-smoke-"), for_vllm=True),
               prompts=1, group=2, tokens=4, warmup=1, steps=1, only="colocated,k1" if served else "colocated")
    if a.warmup < 1 or a.steps < 1:
        p.error("--warmup and --steps must be >= 1 (the first step fills the pipeline)")
    if a.run:
        print(json.dumps(one_run(a)), flush=True)
        return
    print(cpu_line(), flush=True)
    print(f"{a.model}: {a.prompts} prompts x {a.group} samples x {a.tokens} new tokens; {a.warmup} warm-up + "
          f"{a.steps} measured steps per run", flush=True)
    results = {}
    root = Path(tempfile.mkdtemp(prefix="bench-async-"))
    try:
        for run in a.only.split(","):
            argv = [sys.executable, __file__, "--run", run, "--out", str(root / run), "--model", a.model,
                    "--prompts", str(a.prompts), "--group", str(a.group), "--tokens", str(a.tokens),
                    "--warmup", str(a.warmup), "--steps", str(a.steps)]
            done = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=True)
            result = json.loads(done.stdout.strip().splitlines()[-1])
            results[run] = s = summary(result)
            phases = ", ".join(f"{k} {s[k]:.1f}" for k in PHASES if s[k])
            print(f"{run}: {s['steps_per_s']:.4f} steps/s ({s['step_s']:.1f} s a step); trainer idle "
                  f"{s['trainer_idle_share']:.2f}, server idle {s['server_idle_share']:.2f}; per step (s): {phases}; "
                  f"engine: {result['setup'].get('rollout_engine')}; formats: {result['setup'].get('formats')}",
                  flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if "k1" in results and "colocated" in results:
        ratio = results["k1"]["steps_per_s"] / results["colocated"]["steps_per_s"]
        print(f"k1 / colocated: {ratio:.2f}x steps per second", flush=True)


if __name__ == "__main__":
    sys.exit(main())
