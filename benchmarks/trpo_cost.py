"""What one policy update costs: GRPO's clipped Adam step vs PPO's (with its critic) vs TRPO's
natural-gradient step, on the same rollout of the same model.

Each (model, method) runs in its own process so its peak resident memory is its own. The numbers
are seconds of the update call (rollout excluded) and the peak RSS growth during it over the RSS
before it (the model, reference and rollout are already in memory then).

    python benchmarks/trpo_cost.py --model tiny
    python benchmarks/trpo_cost.py --model smollm2-135m --lora_rank 8
    python benchmarks/trpo_cost.py --model smollm2-135m
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import time
from pathlib import Path
from tempfile import mkdtemp

from machine import cpu_line  # benchmarks/machine.py: every figure says which CPU it came from
from smoke import add_smoke, shrink


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def peak_mb() -> float:
    from grouprl.run.logs import peak_rss_mb

    return peak_rss_mb()


def measure(method: str, args: dict, out: multiprocessing.Queue) -> None:
    import torch

    from grouprl.cli.build import load_model
    from grouprl.run.logs import PhaseTimer
    from grouprl.tasks import get_task
    from grouprl.trainer.config import TrainerConfig
    from grouprl.trainer.trainer import Trainer

    torch.set_num_threads(args["threads"])
    config = TrainerConfig(algo=method, prompts_per_step=args["prompts"], group_size=args["group"],
                           max_new_tokens=args["tokens"], micro_batch_size=args["prompts"] * args["group"], beta=0.04,
                           lr=1e-5, seed=0, lora_rank=args["lora_rank"], lr_schedule="constant", output_dir=mkdtemp(),
                           progress=False)
    task = get_task("arithmetic")
    rows = task.rows("train", 64, seed=0)
    policy, tokenizer = load_model(args["model"], 0)
    trainer = Trainer(config, policy=policy, tokenizer=tokenizer, reward_fns=list(task.reward_fns),
                      train_data=rows, system_prompt=task.system_prompt)
    got = trainer.collector.collect(0, PhaseTimer())
    mask = got.batch.completion_mask
    old_logp = trainer.passes.old_logprobs(got.batch)
    ref_logp = trainer.passes.reference_logprobs(got.batch) if config.needs_reference else None
    data, _, _ = trainer.baseline.prepare(got, mask, old_logp, ref_logp, config.beta, 0)  # the algorithm's advantages
    batch = got.batch
    before_rss, t0 = rss_mb(), time.perf_counter()
    metrics = trainer.rule.update(data, 0, 0.0 if config.kl_penalty_in_reward else config.beta)
    seconds = time.perf_counter() - t0
    params = sum(p.numel() for p in trainer.policy.parameters() if p.requires_grad)
    out.put({"method": method, "model": args["model"], "lora_rank": args["lora_rank"], "trainable_params": params,
             "rows": batch.batch_size, "tokens": int(mask.sum()), "update_s": round(seconds, 2),
             "rss_before_mb": round(before_rss), "peak_growth_mb": round(max(0.0, peak_mb() - before_rss)),
             **{k: round(v, 3) for k, v in metrics.items() if k.startswith("trpo/")}})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--lora_rank", type=int, default=0)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--methods", default="grpo,ppo,trpo")
    parser.add_argument("--out", default=None, help="append the JSON lines to this file")
    add_smoke(parser, "the tiny model, 1 prompt x 2 samples of 4 tokens, one thread, each method")
    a = shrink(parser.parse_args(), model="tiny", lora_rank=0, prompts=1, group=2, tokens=4, threads=1, out=None)
    print(cpu_line(), flush=True)
    args = {k: getattr(a, k) for k in ("model", "lora_rank", "prompts", "group", "tokens", "threads")}
    ctx = multiprocessing.get_context("spawn")
    for method in a.methods.split(","):
        queue = ctx.Queue()
        proc = ctx.Process(target=measure, args=(method, args, queue))
        proc.start()
        result = queue.get()
        proc.join()
        line = json.dumps(result)
        print(line, flush=True)
        if a.out:
            with Path(a.out).open("a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    main()
