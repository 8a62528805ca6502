"""What a whole training step gains from vLLM rollouts: ``grouprl train`` with ``rollout_engine: hf`` and
``vllm``, the same run otherwise, at P prompts x G samples x N new tokens.

    python benchmarks/step_engines.py [--prompts 8] [--group 8] [--tokens 128,512] [--steps 3] [--threads 2]

Each run trains the bundled SmolLM2-135M-Instruct on story prompts ("Write a long, detailed story about
...") with a reward for length, so that completions run long and decoding weighs as the setting says
(the mean length each engine sampled is printed). Everything but the engine is the same, grouprl's
defaults included (``dtype: auto``).
Seconds per step are the median over the steps after the first (the first includes engine start-up and
the first weight push); the phases come from the run's own ``time/*`` metrics. Runs alternate between the
engines per setting; the last line is ``step_speedup=<hf seconds / vllm seconds at the last setting>``.
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
from smoke import add_smoke, shrink, tiny_folder

ENGINES = ("hf", "vllm")
PHASES = ("time/rollout", "time/logprobs", "time/update", "time/weight_push")


TOPICS = ("a lighthouse keeper", "a lost letter", "the first snow", "a clockmaker", "a river journey", "an old map",
          "a night market", "a broken violin", "a desert town", "a sleeping dragon", "a train at midnight",
          "a garden on the moon", "a secret library", "a storm at sea", "a forgotten song", "a mountain village")


def inputs(root: Path) -> tuple[Path, str]:
    """Story prompts and a length reward, written under ``root``."""
    data, module = root / "stories.jsonl", root / "length_reward.py"
    data.write_text("".join(json.dumps({"prompt": f"Write a long, detailed story about {t}."}) + "\n" for t in TOPICS))
    module.write_text("def length(prompts, completions, **_):\n    return [len(c) / 100 for c in completions]\n")
    return data, f"{module}:length"


def run(engine: str, tokens: int, args: argparse.Namespace, root: Path) -> dict:
    out = root / f"{engine}-{tokens}"
    data, reward = inputs(root)
    argv = [sys.executable, "-m", "grouprl", "train", "--no-progress", "--model", args.model,
            "--dataset", str(data), "--reward_functions", reward, "--eval_fraction", "0",
            "--prompts_per_step", str(args.prompts), "--group_size", str(args.group),
            "--max_new_tokens", str(tokens), "--total_steps", str(args.steps), "--lr", "1e-6",
            "--log_completions_every", "0", "--print_completions", "0",
            "--num_threads", str(args.threads), "--rollout_engine", engine, "--output_dir", str(out)]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    steps = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "time/step" in r]
    later = steps[1:] or steps
    return {"engine": engine, "tokens": tokens, "step_s": statistics.median(r["time/step"] for r in later),
            "len_mean": statistics.mean(r["rollout/len_mean"] for r in later),
            **{p: statistics.median(r.get(p, 0.0) for r in later) for p in PHASES},
            "dtype": steps[0].get("setup/dtype", ""), "steps": len(steps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", default="128,512", help="max_new_tokens settings, comma-separated")
    parser.add_argument("--steps", type=int, default=3, help="steps per run; the first is left out of the median")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="smollm2-135m", help="the model both engines train")
    add_smoke(parser, "the tiny model with 64-dimension heads (as a model folder), one step of 1 prompt x 2 of 4 "
                      "tokens per engine")
    args = shrink(parser.parse_args(), prompts=1, group=2, tokens="4", steps=1, threads=1,
                  model=lambda: tiny_folder(tempfile.mkdtemp(prefix="step-engines-smoke-"), for_vllm=True))
    print(cpu_line(), flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for tokens in (int(t) for t in args.tokens.split(",")):
            for engine in ENGINES:
                rows.append(run(engine, tokens, args, Path(tmp)))
                print(json.dumps(rows[-1]), flush=True)
    print(f"\n{args.prompts} prompts x {args.group} samples, median s/step after the first of {args.steps} steps, "
          f"{args.threads} threads:\n")
    print("| new tokens | engine | mean length | s/step | rollout | log-probs | update | weight push |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['tokens']} | {r['engine']} | {r['len_mean']:.0f} | {r['step_s']:.1f} | "
              + " | ".join(f"{r[p]:.1f}" for p in PHASES) + " |")
    last = [r for r in rows if r["tokens"] == rows[-1]["tokens"]]
    by = {r["engine"]: r["step_s"] for r in last}
    for tokens in sorted({r["tokens"] for r in rows}):
        pair = {r["engine"]: r["step_s"] for r in rows if r["tokens"] == tokens}
        print(f"{tokens} new tokens: vLLM step {pair['hf'] / pair['vllm']:.2f}x the built-in engine's")
    print(f"step_speedup={by['hf'] / by['vllm']:.2f}")


if __name__ == "__main__":
    main()
