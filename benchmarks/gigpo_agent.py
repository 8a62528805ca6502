"""GiGPO against episode-level GRPO on the agent demo's game (guess-number: 1 to 8, three guesses,
"higher"/"lower" after each), same seeds: held-out success against step and against wall-clock.

Both train the bundled SmolLM2-135M-Instruct at the settings of ``grouprl demo --agent`` (4 games x 8
trajectories per step, lr 2e-5, beta 0), one with ``advantage: gigpo`` (each turn also compared with
the turns of the same game that started from the same state: the environment's ``state_key``, the
interval still open and the guesses used), the other with ``advantage: grpo``. Held-out success is
``eval/success`` over 4 plays of each of 32 held-out games, every ``--eval_every`` steps.

    python benchmarks/gigpo_agent.py [--seeds 0,1,2] [--steps 30] [--eval_every 10] [--set KEY=VALUE ...]
                                     [--variants grpo,gigpo]

``--set`` changes one ``grouprl train`` setting for both variants (repeatable), e.g. the policy loss of an
ablation (docs/policy-losses.md): ``--set policy_loss=cispo --set mu=2 --out benchmarks/results/gigpo-agent-cispo``.
``--variants grpo`` runs one advantage only, for an ablation of something else (half the time).

Runs alternate between the variants, seed by seed, so that load from elsewhere falls on both alike.
Writes ``results.jsonl`` (every evaluation of every run) and ``results.md`` to ``--out``; the last
line is ``success_gain_ratio=<GiGPO's mean gain in held-out success over the base / GRPO's>`` at
the last step (when both variants ran).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import cpu_line
from smoke import add_smoke, shrink

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from grouprl.cli.demo import AGENT_DEMO  # noqa: E402

VARIANTS = ("grpo", "gigpo")


def run(variant: str, seed: int, args: argparse.Namespace, root: Path) -> list[dict]:
    out = root / f"{variant}-seed{seed}"
    settings = {**AGENT_DEMO, "total_steps": args.steps, "eval_every": args.eval_every, "seed": seed,
                "advantage": variant, "output_dir": str(out), "log_completions_every": args.steps, **dict(args.set)}
    argv = [sys.executable, "-m", "grouprl", "train", "--no-progress"]
    for key, value in settings.items():
        argv += [f"--{key}", str(value)]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    wall = {r["step"]: r["wall_time"] for r in records if "time/step" in r}
    train_seconds, total = {0: 0.0}, 0.0
    for r in records:
        if "time/step" in r:
            total += r["time/step"]
            train_seconds[r["step"]] = total
    return [{"variant": variant, "seed": seed, "step": r["step"], "success": r["eval/success"],
             "train_seconds": train_seconds.get(r["step"], wall.get(r["step"]))}
            for r in records if "eval/success" in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--eval_every", type=int, default=10)
    parser.add_argument("--out", default="benchmarks/results/gigpo-agent")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="advantages to run, of grpo,gigpo")
    parser.add_argument("--set", action="append", default=[], type=lambda t: tuple(t.split("=", 1)),
                        metavar="KEY=VALUE", help="a grouprl train setting for both variants (repeatable)")
    add_smoke(parser, "one seed, one step of one reset x 2 (3 turns of 4 tokens) on the tiny model (its context "
                      "is 512 tokens), one held-out reset, into a temporary folder")
    args = shrink(parser.parse_args(), seeds="0", steps=1, eval_every=1,
                  out=lambda: tempfile.mkdtemp(prefix="gigpo-smoke-"),
                  set=[("model", "tiny"), ("prompts_per_step", "1"), ("group_size", "2"), ("max_new_tokens", "4"),
                       ("max_turns", "3"), ("max_trajectory_tokens", "256"), ("eval_size", "1"), ("eval_samples", "1")])
    variants = tuple(v for v in args.variants.split(",") if v)
    if not variants or set(variants) - set(VARIANTS):
        parser.error(f"--variants takes some of {','.join(VARIANTS)}, got {args.variants!r}")
    print(cpu_line(), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    done = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()] \
        if (out / "results.jsonl").exists() else []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in (int(s) for s in args.seeds.split(",")):
            for variant in variants:
                if any(r["variant"] == variant and r["seed"] == seed for r in done):
                    continue  # resumed: this run finished before
                rows = run(variant, seed, args, Path(tmp))
                done += rows
                with open(out / "results.jsonl", "a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in rows)
                print(json.dumps(rows[-1]), flush=True)
    steps = sorted({r["step"] for r in done})
    lines = [cpu_line(), "", f"`python benchmarks/gigpo_agent.py --seeds {args.seeds} --steps {args.steps} "
             f"--eval_every {args.eval_every}"
             + (f" --variants {args.variants}" if variants != VARIANTS else "")
             + "".join(f" --set {k}={v}" for k, v in args.set) + "`", "",
             "Held-out success, mean over seeds (min-max); seconds of training to reach the step, mean.", "",
             "| step | " + " | ".join(f"{v} success | {v} s" for v in variants) + " |",
             "|---|" + "---|---|" * len(variants)]
    for step in steps:
        cells = []
        for v in variants:
            at = [r for r in done if r["variant"] == v and r["step"] == step]
            vals = [r["success"] for r in at]
            cells += [f"{statistics.mean(vals):.3f} ({min(vals):.3f}-{max(vals):.3f})",
                      f"{statistics.mean(r['train_seconds'] or 0.0 for r in at):.0f}"]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    (out / "results.md").write_text(table + "\n")
    if variants != VARIANTS:
        return
    gains = {}
    for v in VARIANTS:
        by_seed = {}
        for r in done:
            if r["variant"] == v:
                by_seed.setdefault(r["seed"], {})[r["step"]] = r["success"]
        gains[v] = statistics.mean(s[max(s)] - s[0] for s in by_seed.values())
    print(f"success_gain_ratio={gains['gigpo'] / gains['grpo']:.2f}" if gains["grpo"] else
          f"success_gain_ratio=inf (GRPO gained {gains['grpo']:.3f})")


if __name__ == "__main__":
    main()
