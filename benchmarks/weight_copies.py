"""What the weight-only rollout formats' copies cost (``grouprl/rollout/weight_only.py``): the seconds a rollout
spends making them, and how far rounding the weights to bf16 moves the model's log-probs before and after one
optimizer step.

SmolLM2-135M-Instruct, its 211 matrix products (q, k, v, o, gate, up, down of 30 layers and the LM head). The
copies of each format are made ``--repeats`` times over the fp32 weights (as each rollout makes them); the first
pays for fresh memory, so min and max are printed. Then 16 completions of arithmetic prompts are scored (the
same tokens throughout) by the fp32 model and by a twin whose products' weights are rounded to bf16 (the
embedding left in fp32, as bf16-weights rollouts leave it), before and after one Adam step at ``--lr`` on those
completions' log-likelihood: SmolLM2 ships in bf16, so its weights start on bf16's grid, and an update smaller
than half a bf16 step rounds back to the old value in the copy. Beside it, a twin rounded stochastically (up or
down with the probabilities that make the copy's expectation the fp32 weight, a seeded draw), which the copies do
not use: what it would change is printed, for the next step on bf16 rollouts' lag.

    python benchmarks/weight_copies.py --threads 1

The last line is ``bf16_gap_before=<mean |log-prob difference|> bf16_gap_after=<the same after the step>``.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from machine import cpu_line  # benchmarks/machine.py: every figure says which CPU it came from
from rollout import G, prompts
from smoke import add_smoke, policy, shrink
from torch import nn

from grouprl.rollout.cpu.weight_only import Copies, model_linears
from grouprl.rollout.formats import FORMATS
from grouprl.rollout.logprobs import token_logprobs
from grouprl.rollout.sampler import Sampler
from grouprl.types import SamplingParams


def stochastic_bf16(w: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``w`` (fp32) rounded to a bf16 value stochastically: a uniform 16-bit draw added below the bits bf16 keeps,
    then those bits cut, so ``w`` rounds up with probability its distance from the value below over the step."""
    noise = torch.randint(0, 1 << 16, w.shape, dtype=torch.int32, generator=generator)
    return ((w.view(torch.int32) + noise) & ~0xFFFF).view(torch.float32)


def rounded_twin(model: nn.Module, stochastic: bool = False) -> nn.Module:
    """A copy of ``model`` whose ``nn.Linear`` weights are rounded to bf16, to nearest even or stochastically (an
    untied LM head: the embedding stays)."""
    twin, generator = copy.deepcopy(model), torch.Generator().manual_seed(0)
    with torch.no_grad():
        twin.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())
        for m in model_linears(twin):
            m.weight.copy_(stochastic_bf16(m.weight, generator) if stochastic else m.weight.bfloat16().float())
    return twin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-6, help="the Adam step's learning rate")
    add_smoke(parser, "the tiny model, one timing")
    args = shrink(parser.parse_args(), repeats=1)
    torch.set_num_threads(args.threads)
    print(cpu_line(), f"threads {args.threads}", flush=True)
    model, tokenizer = policy("smollm2-135m", args.smoke, dtype=torch.float32)
    for fmt in FORMATS:
        spec = FORMATS.get(fmt).weight_only
        if spec is None:
            continue
        problem = spec.unavailable()
        if problem:
            print(f"{fmt}: cannot run here ({problem})", flush=True)
            continue
        linears = [m for m in model_linears(model) if spec.supported(m)]
        seconds = []
        for _ in range(args.repeats):
            copies, start = Copies(spec), time.perf_counter()
            for m in linears:
                copies.of(m)
            seconds.append(time.perf_counter() - start)
        print(f"{fmt}: {len(linears)} products, copies {copies.nbytes / 1e6:.0f} MB made in "
              f"{min(seconds):.3f}-{max(seconds):.3f} s", flush=True)
    sampler = Sampler(model, tokenizer)
    batch = sampler.generate(sampler.encode(prompts(4 * G)), G, SamplingParams(max_new_tokens=32,
                                                                                   temperature=1.0), seed=0)
    mask = batch.completion_mask.bool()

    @torch.no_grad()
    def gap(stochastic: bool = False) -> float:
        scores = [token_logprobs(m, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                 batch.completion_mask)[0] for m in (model, rounded_twin(model, stochastic))]
        return float((scores[0] - scores[1])[mask].abs().mean())

    before, stochastic_before = gap(), gap(True)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    logp, _ = token_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                             batch.completion_mask)  # differentiable: grad is on here
    (-(logp * batch.completion_mask).sum() / batch.completion_mask.sum()).backward()
    optimizer.step()
    after = gap()
    print(f"rounding the products' weights to bf16 moves a completion token's log-prob by {before:.2e} on "
          f"average before one Adam step at lr {args.lr:g}, {after:.2e} after it; rounding stochastically "
          f"{stochastic_before:.2e} and {gap(True):.2e}", flush=True)
    print(f"bf16_gap_before={before:.3e} bf16_gap_after={after:.3e}")


if __name__ == "__main__":
    main()
