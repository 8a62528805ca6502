"""How often the base model succeeds in a built-in environment, and how many groups of G
trajectories all agree (GRPO learns nothing from those: their advantages are all zero).

    python benchmarks/calibrate_envs.py --env guess-number --resets 32 --group 8
    python benchmarks/calibrate_envs.py --env guess-number --options '{"high": 16, "max_guesses": 4}'
    python benchmarks/calibrate_envs.py --env calculator --max-new-tokens 48

Plays trajectories exactly as the trainer's evaluation does (the multi-turn engine, temperature 1,
the resets' own seeds) and prints the success rate, the all-equal-group share, turns and tool calls
per trajectory, why trajectories ended, and one sample conversation.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

import torch
from machine import cpu_line  # benchmarks/machine.py: every figure says which CPU it came from
from smoke import add_smoke, shrink

from grouprl.cli.build import build_inputs, load_model
from grouprl.config import TrainConfig
from grouprl.models.precision import pinned, resolve_formats
from grouprl.run.seed_streams import EVAL_STREAM, group_seeds, mix_seed
from grouprl.trainer.rollout_plan import plan_rollout
from grouprl.trainer.sampling import rollout_params
from grouprl.trainer.sources import make_source
from grouprl.trainer.trainer import with_values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="guess-number")
    parser.add_argument("--options", default="{}", help="env_options as JSON")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--resets", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=24, help="per turn")
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--batch-resets", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    add_smoke(parser, "the tiny model, one reset x 2, one turn of 4 tokens")
    args = shrink(parser.parse_args(), model="tiny", resets=1, group=2, max_new_tokens=4, max_turns=1, batch_resets=1,
                  threads=1)
    print(cpu_line(), flush=True)

    torch.set_num_threads(args.threads)
    config = TrainConfig(model=args.model, env=args.env, env_options=json.loads(args.options),
                         max_new_tokens=args.max_new_tokens, max_turns=args.max_turns, eval_size=args.resets,
                         seed=args.seed, temperature=1.0,
                         **({"max_trajectory_tokens": 256} if args.smoke else {}))  # the tiny model's context: 512
    inputs = build_inputs(config)
    policy, tokenizer = load_model(config.model, config.seed)
    formats = resolve_formats(config.dtype, config.ref_dtype, config.rollout_dtype)  # as grouprl eval decides them
    config = with_values(config, pinned(formats))
    plan = plan_rollout(config, formats, policy, None, multi_turn=True, steps=1)
    source = make_source(config, inputs, policy, tokenizer, plan, None, lambda n: (0, n))
    collector, rows = source.eval_collector, inputs.eval_rows
    start, success, turns, tools, reasons, per_group, sample = time.perf_counter(), [], [], [], Counter(), [], None
    for first in range(0, len(rows), args.batch_resets):
        chunk = rows[first:first + args.batch_resets]
        batch = collector.sampler.generate(collector.episodes(chunk, range(first, first + len(chunk)), args.group),
                                           args.group, rollout_params(config),
                                           seed=group_seeds(mix_seed(config.seed, EVAL_STREAM), first, len(chunk),
                                                            args.group))
        flags = [bool(s) for s in batch.info["success"]]
        success += flags
        per_group += [sum(flags[p * args.group:(p + 1) * args.group]) for p in range(len(chunk))]
        turns += batch.info["turns"]
        tools += batch.info["tool_calls"]
        reasons.update(batch.info["end_reason"])
        sample = sample or batch.extras["trajectory"][0]
        print(f"  {len(success)}/{len(rows) * args.group} trajectories", flush=True)
    seconds = time.perf_counter() - start
    all_equal = sum(k in (0, args.group) for k in per_group)
    print(f"env {args.env} {config.env_options}: {len(rows)} resets x {args.group}, {seconds:.0f} s")
    print(f"success {sum(success) / len(success):.3f}  all-equal groups {all_equal}/{len(per_group)} "
          f"({all_equal / len(per_group):.0%})  turns {sum(turns) / len(turns):.2f}  "
          f"tool calls {sum(tools) / len(tools):.2f}  ended {dict(reasons)}")
    print("successes per group:", dict(sorted(Counter(per_group).items())))
    for m in sample:
        print(f"[{m['role']}] {m['content']!r}")


if __name__ == "__main__":
    main()
