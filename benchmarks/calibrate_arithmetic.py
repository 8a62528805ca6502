"""Measure how often the base model solves the arithmetic task, and how many groups of G
samples all agree (GRPO learns nothing from those: their advantages are all zero).

    python benchmarks/calibrate_arithmetic.py --prompts 32 --group 8            # default task
    python benchmarks/calibrate_arithmetic.py --digits 2 --operations + --prompts 16

Samples at temperature 1 with plain ``model.generate`` (no top-k/top-p), through the chat
template, and prints accuracy, the all-equal-group fraction and a histogram of correct samples
per group; ``--json`` writes the figures and every completion.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

import torch
from machine import cpu_line  # benchmarks/machine.py: every figure says which CPU it came from
from smoke import add_smoke, policy, shrink

from grouprl.rollout.prompts import render_prompt
from grouprl.tasks import get_task


def sample(model, tokenizer, texts: list[str], group: int, max_new_tokens: int, batch_rows: int) -> list[str]:
    """G completions per text, prompt-major: returns len(texts) * group strings."""
    rows = [t for t in texts for _ in range(group)]
    tokenizer.padding_side = "left"  # generate appends after the last column
    out: list[str] = []
    for start in range(0, len(rows), batch_rows):
        enc = tokenizer(rows[start:start + batch_rows], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            ids = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                 max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
        out += tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        print(f"  {len(out)}/{len(rows)} rows", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--batch-rows", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--digits", type=int)
    parser.add_argument("--operations")
    parser.add_argument("--operands", type=int)
    parser.add_argument("--prompt-template")
    parser.add_argument("--system-prompt")
    parser.add_argument("--json", help="write figures and completions to this file")
    add_smoke(parser, "the tiny model, 2 prompts x 2 samples of 4 tokens")
    args = shrink(parser.parse_args(), prompts=2, group=2, max_new_tokens=4, batch_rows=4, threads=1)
    print(cpu_line(), flush=True)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    options = {k: v for k, v in {"digits": args.digits, "operations": args.operations, "operands": args.operands,
                                 "prompt_template": args.prompt_template, "system_prompt": args.system_prompt}.items()
               if v is not None}
    task = get_task("arithmetic", **options)
    rows = task.rows("eval", args.prompts, seed=args.seed)
    model, tokenizer = policy(args.model, args.smoke)
    texts = [render_prompt(tokenizer, r["prompt"], system_prompt=task.system_prompt) for r in rows]

    start = time.perf_counter()
    completions = sample(model, tokenizer, texts, args.group, args.max_new_tokens, args.batch_rows)
    seconds = time.perf_counter() - start
    correct = [task.is_correct(c, rows[i // args.group]) for i, c in enumerate(completions)]
    per_group = [sum(correct[p * args.group:(p + 1) * args.group]) for p in range(args.prompts)]
    all_equal = sum(k in (0, args.group) for k in per_group)
    figures = {
        "task_options": options, "prompts": args.prompts, "group": args.group, "seed": args.seed,
        "accuracy": sum(correct) / len(correct), "all_equal_groups": all_equal,
        "all_equal_fraction": all_equal / args.prompts, "all_wrong_groups": per_group.count(0),
        "all_right_groups": per_group.count(args.group), "seconds": round(seconds, 1),
        "correct_per_group_histogram": dict(sorted(Counter(per_group).items())),
    }
    print(json.dumps(figures, indent=1))
    for i in range(0, min(len(completions), 3 * args.group), args.group):
        print(repr(rows[i // args.group]["prompt"]), "->", [completions[i + g][:40] for g in range(min(3, args.group))])
    if args.json:
        samples = [{"prompt": rows[i // args.group]["prompt"], "answer": rows[i // args.group]["answer"],
                    "completion": c, "correct": ok} for i, (c, ok) in enumerate(zip(completions, correct))]
        with open(args.json, "w") as f:
            json.dump({**figures, "samples": samples}, f, indent=1)


if __name__ == "__main__":
    main()
