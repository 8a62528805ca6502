"""A group judge against the exact-match reward on the demo's arithmetic task: held-out accuracy after
the same steps, same seeds.

1. Preference pairs from the task's answers: for each of ``--pairs`` training problems (drawn apart
   from the held-out ones), the right answer is chosen over a wrong one (off by 1 to 3), written
   either as the bare number or as ``<expression> = <number>``.
2. ``grouprl train-rm`` fits SmolLM2-135M-Instruct with a score head to them (Bradley-Terry).
3. ``grouprl demo``'s settings (4 problems x 8, 12 steps, lr 2e-5, beta 0.04) train twice per seed:
   with ``judge: reward_model:<that model>`` (each member's mean win probability over its group is
   its reward) and with the task's exact-match reward. Held-out accuracy is the task's checker either
   way (32 problems x 4 samples at temperature 1).

    python benchmarks/judge_arithmetic.py [--seeds 0,1,2] [--steps 12] [--pairs 600] [--rm_epochs 3] [--rm_lr 5e-5]

The last line is ``accuracy_ratio=<judge's mean held-out accuracy gain / exact match's>``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import cpu_line
from smoke import add_smoke, shrink

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from grouprl.cli.demo import DEMO  # noqa: E402
from grouprl.tasks import get_task  # noqa: E402

VARIANTS = ("exact_match", "judge")
SMOKE_SETTINGS = {"model": "tiny", "prompts_per_step": 1, "group_size": 2, "max_new_tokens": 4, "eval_size": 2,
                  "eval_samples": 1}
"""What ``--smoke`` changes of the demo's settings, for both variants."""


def make_pairs(n: int, path: Path) -> None:
    rng = random.Random(1234)
    rows = get_task("arithmetic").rows("train", n, 1234)
    with open(path, "w") as f:
        for row in rows:
            wrong = row["answer"] + rng.choice([-3, -2, -1, 1, 2, 3])
            form = rng.choice(["{}", row["expression"] + " = {}"])
            f.write(json.dumps({"prompt": row["prompt"], "chosen": form.format(row["answer"]),
                                "rejected": form.format(wrong)}) + "\n")


def train(variant: str, seed: int, rm: Path, args: argparse.Namespace, root: Path) -> dict:
    out = root / f"{variant}-seed{seed}"
    # one thread: a second one spinning against another process on a 2-core machine slows a step 10x
    settings = {**DEMO, "total_steps": args.steps, "seed": seed, "output_dir": str(out), "eval_every": 0,
                "num_threads": 1, **args.extra}
    argv = [sys.executable, "-m", "grouprl", "train", "--no-progress"]
    for key, value in settings.items():
        argv += [f"--{key}", str(value)]
    if variant == "judge":
        argv += ["--judge", f"reward_model:{rm}"]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval/accuracy" in r]
    agreement = [r["judge/agreement"] for r in records if "judge/agreement" in r]
    return {"variant": variant, "seed": seed, "before": evals[0]["eval/accuracy"], "after": evals[-1]["eval/accuracy"],
            "seconds": sum(r.get("time/step", 0.0) for r in records),
            "judge_agreement": statistics.mean(agreement) if agreement else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--pairs", type=int, default=600)
    parser.add_argument("--rm_epochs", type=int, default=3, help="epochs of the reward model over the pairs")
    parser.add_argument("--rm_lr", type=float, default=5e-5, help="the reward model's learning rate")
    parser.add_argument("--out", default="benchmarks/results/judge-arithmetic")
    add_smoke(parser, "the tiny model as policy and reward model, 8 pairs, one seed, one step of 1 prompt x 2, "
                      "into a temporary folder")
    args = shrink(parser.parse_args(), seeds="0", steps=1, pairs=8, rm_epochs=1,
                  out=lambda: tempfile.mkdtemp(prefix="judge-smoke-"))
    args.extra = SMOKE_SETTINGS if args.smoke else {}
    print(cpu_line(), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        pairs, rm = Path(tmp) / "pairs.jsonl", Path(tmp) / "rm"
        make_pairs(args.pairs, pairs)
        done = subprocess.run([sys.executable, "-m", "grouprl", "train-rm", "--pairs", str(pairs), "--output_dir",
                               str(rm), "--epochs", str(args.rm_epochs), "--lr", str(args.rm_lr),
                               *(["--model", "tiny"] if args.smoke else [])],
                              check=True, capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        rm_line = next((line for line in done.stdout.splitlines() if "ranked right" in line), "").strip()
        print(rm_line, flush=True)
        for seed in (int(s) for s in args.seeds.split(",")):
            for variant in VARIANTS:
                rows.append(train(variant, seed, rm, args, Path(tmp)))
                print(json.dumps(rows[-1]), flush=True)
    lines = [cpu_line(), "", f"`python benchmarks/judge_arithmetic.py --seeds {args.seeds} --steps {args.steps} "
             f"--pairs {args.pairs} --rm_epochs {args.rm_epochs} --rm_lr {args.rm_lr}`", "",
             f"reward model: {' '.join(rm_line.split())}", "",
             "| reward | held-out accuracy before | after, mean (min-max) | per seed | judge agreement | s |",
             "|---|---|---|---|---|---|"]
    gains = {}
    for v in VARIANTS:
        mine = [r for r in rows if r["variant"] == v]
        after = [r["after"] for r in mine]
        gains[v] = statistics.mean(r["after"] - r["before"] for r in mine)
        agree = [r["judge_agreement"] for r in mine if r["judge_agreement"] is not None]
        agreement = f"{statistics.mean(agree):.2f}" if agree else "-"
        lines.append(f"| {v} | {statistics.mean(r['before'] for r in mine):.3f} | {statistics.mean(after):.3f} "
                     f"({min(after):.3f}-{max(after):.3f}) | {', '.join(f'{a:.3f}' for a in after)} | {agreement} | "
                     f"{statistics.mean(r['seconds'] for r in mine):.0f} |")
    table = "\n".join(lines)
    print(table)
    (out / "results.md").write_text(table + "\n")
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"accuracy_ratio={gains['judge'] / gains['exact_match']:.2f}" if gains["exact_match"] else
          f"accuracy_ratio=inf (exact_match gained {gains['exact_match']:.3f})")


if __name__ == "__main__":
    main()
