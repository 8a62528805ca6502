"""GiGPO against episode-level GRPO on CartPole-v1: environment steps to solve, same seeds.

Both run ``grouprl rl --algo grpo`` at the defaults that solve CartPole (README), one with
``grpo.advantage: gigpo`` (step groups from observations rounded to ``--decimals``), the other with
the episode-level ``grpo`` advantage. Solved = the greedy policy's mean return over 20 held-out
episodes reaches 475 at an evaluation (every ``--eval_every`` env steps).

    python benchmarks/gigpo_cartpole.py [--seeds 0,1,2] [--decimals 1] [--budget 200000]

Prints a table (mean and min-max over seeds) and writes it with the per-seed numbers to
``--out``; the last line is ``steps_ratio=<GRPO's mean env steps to solve / GiGPO's>`` (> 1: GiGPO
solves in fewer steps). A run that does not solve within the budget counts as the budget.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from machine import cpu_line
from smoke import add_smoke, shrink

from grouprl.control import ControlConfig
from grouprl.control.config import GRPOControlConfig
from grouprl.control.training import ControlTrainer

VARIANTS = {"grpo": {"advantage": "grpo"}, "gigpo": {"advantage": "gigpo"}}


def run(variant: str, seed: int, args: argparse.Namespace, root: Path) -> dict:
    section = {**VARIANTS[variant], "state_key_decimals": args.decimals} if variant == "gigpo" else VARIANTS[variant]
    cfg = ControlConfig(env="CartPole-v1", algo="grpo", seed=seed, total_env_steps=args.budget,
                        stop_at_return=475.0, eval_every_env_steps=args.eval_every, eval_episodes=20,
                        output_dir=str(root / f"{variant}-seed{seed}"), progress=False, tensorboard=False,
                        grpo=GRPOControlConfig(**section))
    start = time.perf_counter()
    summary = ControlTrainer(cfg).train()
    solved = summary["solved_at_env_steps"]
    return {"variant": variant, "seed": seed, "solved_at": solved, "steps": solved or args.budget,
            "seconds": time.perf_counter() - start, "final_return": summary["eval_after"]["eval/mean_reward"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--decimals", type=int, default=1)
    parser.add_argument("--budget", type=int, default=200_000)
    parser.add_argument("--eval_every", type=int, default=5000)
    parser.add_argument("--out", default="benchmarks/results/gigpo-cartpole")
    add_smoke(parser, "one seed, 400 environment steps, into a temporary folder")
    args = shrink(parser.parse_args(), seeds="0", budget=400, eval_every=200,
                  out=lambda: tempfile.mkdtemp(prefix="gigpo-smoke-"))
    print(cpu_line(), flush=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            for variant in VARIANTS:  # alternate, so that load from elsewhere falls on both alike
                rows.append(run(variant, seed, args, Path(tmp)))
                print(json.dumps(rows[-1]), flush=True)
    lines = [f"{cpu_line()}", "", f"`python benchmarks/gigpo_cartpole.py --seeds {args.seeds} --decimals "
             f"{args.decimals} --budget {args.budget}`", "",
             "| advantage | seeds solved | env steps to solve, mean (min-max) | seconds, mean | per seed |",
             "|---|---|---|---|---|"]
    means = {}
    for variant in VARIANTS:
        mine = [r for r in rows if r["variant"] == variant]
        steps = [r["steps"] for r in mine]
        means[variant] = statistics.mean(steps)
        lines.append(f"| {variant} | {sum(r['solved_at'] is not None for r in mine)}/{len(mine)} | "
                     f"{means[variant]:.0f} ({min(steps)}-{max(steps)}) | "
                     f"{statistics.mean(r['seconds'] for r in mine):.1f} | {', '.join(map(str, steps))} |")
    table = "\n".join(lines)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "results.md").write_text(table + "\n")
    print(f"steps_ratio={means['grpo'] / means['gigpo']:.2f}")


if __name__ == "__main__":
    main()
