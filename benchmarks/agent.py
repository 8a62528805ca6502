"""Multi-turn rollouts: the grouprl engine (one KV cache across turns, only the environment's tokens
prefilled between turns) against the obvious baseline (re-render the whole conversation and call
``model.generate`` on it every turn), on the bundled SmolLM2-135M-Instruct.

    python benchmarks/agent.py [--env guess-number] [--options '{"high": 16, "max_guesses": 5}']
        [--max-turns 3] [--resets 4] [--group 8] [--repeats 3] [--threads 2]

Both sides play the same games (same environment seeds) with the same sampling: temperature 1, no
top-k/top-p, ``--max-new-tokens`` per turn, at most ``--max-turns`` turns, stop on EOS, each in fp32 and
in bf16 (autocast). tokens/s counts the policy's tokens (up to and including EOS); the environment's
replies are not counted for either. Runs alternate between the methods and formats so that load from
other processes falls on all alike; medians are printed, and the last line is ``speedup=<the engine in
the format dtype auto picks for rollouts here, over generate in its faster format, tokens/s>``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import torch
from machine import cpu_line
from smoke import add_smoke, policy, shrink

from grouprl.envs import Episode, make_env_factory
from grouprl.models.precision import resolve_formats
from grouprl.rollout.agent import AgentSampler, ChatRenderer
from grouprl.rollout.turns import TurnLimits
from grouprl.types import SamplingParams

FORMATS = ("fp32", "bf16")


def episodes(factory, resets: int, group: int, seed: int) -> list[Episode]:
    return [Episode(factory(), seed=seed + r) for r in range(resets) for _ in range(group)]


def run_engine(sampler: AgentSampler, eps: list[Episode], group: int, params: SamplingParams,
               seed: int) -> tuple[int, float]:
    start = time.perf_counter()
    batch = sampler.generate(eps, group, params, seed=seed)
    return int(batch.completion_mask.sum()), time.perf_counter() - start


def run_generate(model, tokenizer, renderer: ChatRenderer, eps: list[Episode], params: SamplingParams,
                 max_turns: int) -> tuple[int, float]:
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if params.format == "bf16" else contextlib.nullcontext()
    with amp:
        return _run_generate(model, tokenizer, renderer, eps, params, max_turns)


def _run_generate(model, tokenizer, renderer: ChatRenderer, eps: list[Episode], params: SamplingParams,
                  max_turns: int) -> tuple[int, float]:
    """Every turn: render each running conversation, left-pad, ``model.generate``, decode, respond."""
    start, tokens = time.perf_counter(), 0
    running = list(range(len(eps)))
    for ep in eps:
        ep.start()
    eos = tokenizer.eos_token_id
    for _ in range(max_turns):
        if not running:
            break
        rows = [renderer.prompt_ids(eps[i].messages) for i in running]
        width = max(map(len, rows))
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=params.temperature,
                                 top_k=0, top_p=1.0, max_new_tokens=params.max_new_tokens, eos_token_id=eos,
                                 pad_token_id=tokenizer.pad_token_id)
        still = []
        for i, row in zip(running, out[:, width:].tolist()):
            n = row.index(eos) + 1 if eos in row else len(row)
            tokens += n
            text = tokenizer.decode(row[:n], skip_special_tokens=True)
            if eps[i].respond(text) is not None:
                still.append(i)
        running = still
    return tokens, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="guess-number")
    parser.add_argument("--options", default="{}", help="env_options as JSON")
    parser.add_argument("--resets", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    add_smoke(parser, "the tiny model, one reset x 2, one turn of 4 tokens, one repeat")
    args = shrink(parser.parse_args(), resets=1, group=2, max_new_tokens=4, max_turns=1, repeats=1, threads=1)
    print(cpu_line())
    torch.set_num_threads(args.threads)
    model, tokenizer = policy("smollm2-135m", args.smoke, dtype=torch.float32)
    model.eval()
    factory = make_env_factory(args.env, json.loads(args.options))
    renderer = ChatRenderer(tokenizer)
    room = 256 if args.smoke else 512  # for the prompt; the tiny model's whole context is 512 tokens
    limits = TurnLimits(args.max_new_tokens, args.max_turns, args.max_new_tokens * args.max_turns + room)
    sampler = AgentSampler(model, tokenizer, renderer, limits)
    rates: dict[tuple[str, str], list[float]] = {(m, f): [] for m in ("engine", "generate") for f in FORMATS}
    for r in range(args.repeats):
        for method, fmt in rates:
            params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, format=fmt)
            eps = episodes(factory, args.resets, args.group, 100 * r)
            torch.manual_seed(r)
            if method == "engine":
                n, s = run_engine(sampler, eps, args.group, params, r)
            else:
                n, s = run_generate(model, tokenizer, renderer, eps, params, args.max_turns)
            rates[method, fmt].append(n / s)
            print(f"repeat {r}: {method} {fmt} {n} tokens in {s:.1f} s ({n / s:.1f}/s)", flush=True)
    median = {k: statistics.median(v) for k, v in rates.items()}
    chosen = resolve_formats("auto", "auto", "auto").rollout
    best_generate = max(FORMATS, key=lambda f: median["generate", f])
    print(f"{args.env} {args.options}: {args.resets} resets x {args.group}, <= {args.max_turns} turns of <= "
          f"{args.max_new_tokens} tokens, {args.threads} threads; median tokens/s: "
          + ", ".join(f"{m} {f} {v:.1f}" for (m, f), v in median.items())
          + f"; dtype auto samples in {chosen} here")
    print(f"speedup={median['engine', chosen] / median['generate', best_generate]:.2f}")


if __name__ == "__main__":
    main()
