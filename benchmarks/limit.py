"""How close a grouprl GRPO step runs to this machine's limit: model FLOPs utilisation (MFU).

1. The machine's matmul throughput, measured: the median GFLOP/s of large fp32 and bf16 matrix
   products (2048^3, and the model's own MLP shape at 1024 rows) on the given number of threads.
   The higher of the two shapes is a format's peak; each phase's MFU divides by the peak of the format
   ``dtype: auto`` ran it in (printed), so a bf16 phase on a CPU with bf16 units is not flattered by
   fp32's lower peak.
2. The FLOPs of each phase of a step, computed from the model's shape and the step's real token
   counts (the convention of PaLM's MFU: useful work only, so no padding, no recomputation):
   generation = the prefill of each prompt once plus one forward token per generated token;
   log-probs = one forward over each group's prompt and its completions, per pass the step makes
   (the reference model's; the old policy's where the settings need it);
   update = three forwards' worth (forward and backward) over the same tokens; both only over the rows
   the step computes them for (the rows in the loss: ``zero_std_groups: drop``, the default, leaves
   all-equal groups out, and counting them would put MFU past 100%).
   Per token and decoder layer a forward costs 2 * (weights of q, k, v, o and the MLP) plus
   4 * context * hidden for attention; the LM head 2 * hidden * vocab where a prediction is read.
3. The same settings as benchmarks/vs_trl.py (SmolLM2-135M-Instruct, arithmetic, 4 prompts x
   G=4, 64 new tokens, grouprl's defaults, beta 0.04), a few steps, each phase's GFLOP/s and MFU.

    python benchmarks/limit.py --threads 1 --steps 6

The last line is ``mfu_training=<the log-prob passes' and the update's seconds at their formats' peaks,
over their seconds> mfu_step=<the same over all phases> peak_fp32_gflops=<measured> peak_bf16_gflops=<measured>``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch
from machine import cpu_line  # benchmarks/machine.py: every figure says which CPU it came from
from setting import step_trainer
from smoke import add_smoke, shrink
from smoke import policy as load


def matmul_gflops(m: int, k: int, n: int, dtype: torch.dtype, repeats: int = 5) -> tuple[float, int]:
    """(median GFLOP/s, rows used) of ``[m, k] @ [k, n]`` in ``dtype`` (after a warm-up call). Where one call
    would take over a second (a dtype the CPU has no fast kernel for), ``m`` shrinks to fit."""
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    start = time.perf_counter()
    a[:16] @ b
    rate = 2 * 16 * k * n / max(time.perf_counter() - start, 1e-9)
    m = max(16, min(m, int(rate / (2 * k * n))))  # about a second per call at most
    a = a[:m]
    a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * m * k * n / statistics.median(times) / 1e9, m


@dataclass
class Shape:
    """What the FLOP count needs of a decoder-only transformer."""

    hidden: int
    intermediate: int
    layers: int
    kv_dim: int
    vocab: int

    @classmethod
    def of(cls, config) -> Shape:
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        return cls(config.hidden_size, config.intermediate_size, config.num_hidden_layers, kv_heads * head_dim,
                   config.vocab_size)

    def layer_weights(self) -> int:
        h = self.hidden
        return 2 * h * h + 2 * h * self.kv_dim + 3 * h * self.intermediate  # q, o; k, v; gate, up, down

    def forward(self, contexts: list[int]) -> float:
        """FLOPs of the decoder body for tokens at these context lengths (themselves included)."""
        dense = 2 * self.layer_weights() * len(contexts)
        attention = 4 * self.hidden * sum(contexts)
        return self.layers * (dense + attention)

    def head(self, predictions: int) -> float:
        return 2 * self.hidden * self.vocab * predictions


def phase_flops(shape: Shape, prompt_lens: list[int], completion_lens: list[int], group: int,
                live: list[bool] | None = None) -> dict[str, float]:
    """FLOPs of generation, log-probs and update for P prompts (one length each) and B = P * G completions.
    ``live`` (``[B]``, None = all) marks the rows the log-prob passes and the update compute: the rows of
    all-equal groups that ``zero_std_groups: drop`` leaves out of the loss cost nothing there, and a
    group's prompt is run once for its live rows (the packed layout), not at all without one."""
    live = [True] * len(completion_lens) if live is None else live
    prompt_ctx = [i + 1 for lp in prompt_lens for i in range(lp)]
    completion_ctx = [lp + i + 1 for p, lp in enumerate(prompt_lens)
                      for n in completion_lens[p * group:(p + 1) * group] for i in range(n)]
    tokens = sum(completion_lens)
    generation = shape.forward(prompt_ctx) + shape.forward(completion_ctx) + shape.head(len(prompt_lens) + tokens)
    # The last token of each completion predicts nothing; every other token, and the prompt's last, does.
    kept = [(lp, n) for p, lp in enumerate(prompt_lens)
            for n, alive in zip(completion_lens[p * group:(p + 1) * group], live[p * group:(p + 1) * group])
            if alive]
    kept_prompts = [i + 1 for p, lp in enumerate(prompt_lens) if any(live[p * group:(p + 1) * group])
                    for i in range(lp)]
    fed = [lp + i + 1 for lp, n in kept for i in range(max(n - 1, 0))]
    one_pass = shape.forward(kept_prompts) + shape.forward(fed) + shape.head(sum(n for _, n in kept))
    return {"generation": generation, "logprobs": one_pass, "update": 3 * one_pass}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4, help="steps measured after one warm-up step")
    parser.add_argument("--beta", type=float, default=0.04)
    add_smoke(parser, "the tiny model, one warm-up and one measured step")
    args = shrink(parser.parse_args(), steps=1, threads=1)
    print(cpu_line(), flush=True)
    torch.set_num_threads(args.threads)

    policy, tokenizer = load("smollm2-135m", args.smoke, dtype=torch.float32)
    shape = Shape.of(policy.config)
    peaks = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        square, m1 = matmul_gflops(2048, 2048, 2048, dtype, repeats=3)
        mlp, m2 = matmul_gflops(1024, shape.hidden, shape.intermediate, dtype)
        peaks[name] = max(square, mlp)
        print(f"matmul {name}: {square:7.1f} GFLOP/s at {m1}x2048x2048, {mlp:7.1f} at {m2}x{shape.hidden}x"
              f"{shape.intermediate} ({args.threads} thread(s))", flush=True)

    trainer = step_trainer(policy, tokenizer, "limit", beta=args.beta, micro_batch_size=16)
    seen = {}
    collect = trainer.collector.collect

    def capture(step, timer):
        out = collect(step, timer)
        seen["batch"] = out.batch
        return out

    trainer.collector.collect = capture
    rows_in_loss = trainer.baseline.rows_in_loss

    def capture_live(got, mask):
        seen["live"] = rows_in_loss(got, mask)
        return seen["live"]

    trainer.baseline.rows_in_loss = capture_live
    c = trainer.config  # dtype auto has measured by now: each phase's MFU is against its own format's peak
    formats = {"generation": "bf16" if c.rollout_bf16 else "fp32", "logprobs": "bf16" if c.train_bf16 else "fp32",
               "update": "bf16" if c.train_bf16 else "fp32"}
    log_prob_passes = int(c.needs_reference) + int(c.needs_old_logprobs)
    print(f"formats: {', '.join(f'{k} {v}' for k, v in formats.items())}; {log_prob_passes} log-prob pass(es) a step",
          flush=True)
    totals = {k: [0.0, 0.0] for k in ("generation", "logprobs", "update")}  # FLOPs, seconds
    for step in range(args.steps + 1):
        metrics, _ = trainer.step()
        trainer.step_count += 1
        if step == 0:
            continue  # warm-up
        batch = seen["batch"]
        prompt_lens = batch.prompt_mask[:: batch.group_size].sum(-1).tolist()
        live = seen["live"].tolist()
        flops = phase_flops(shape, prompt_lens, batch.lengths.tolist(), batch.group_size, live)
        flops["logprobs"] *= log_prob_passes
        seconds = {"generation": metrics["time/rollout"], "logprobs": metrics["time/logprobs"],
                   "update": metrics["time/update"]}
        for k in totals:
            totals[k][0] += flops[k]
            totals[k][1] += seconds[k]
        print(f"step {step}: " + ", ".join(f"{k} {flops[k] / 1e9:.0f} GFLOP in {seconds[k]:.1f} s" for k in totals)
              + f" ({sum(live)} of {len(live)} rows in the loss)", flush=True)

    print(f"over {args.steps} steps, each phase against the measured peak of its format:")
    at_peak = {}  # seconds each phase would take at its format's peak
    for k, (f, s) in totals.items():
        at_peak[k] = f / (peaks[formats[k]] * 1e9)
        if s > 0 and f > 0:
            print(f"  {k:10s} {f / 1e9:7.0f} GFLOP {s:7.1f} s {f / s / 1e9:6.1f} GFLOP/s  MFU {at_peak[k] / s:.0%} "
                  f"of {formats[k]}'s {peaks[formats[k]]:.1f}")
    train_s = totals["logprobs"][1] + totals["update"][1]
    all_s = sum(s for _, s in totals.values())
    print(f"mfu_training={(at_peak['logprobs'] + at_peak['update']) / train_s:.2f} "
          f"mfu_step={sum(at_peak.values()) / all_s:.2f} peak_fp32_gflops={peaks['fp32']:.1f} "
          f"peak_bf16_gflops={peaks['bf16']:.1f}")


if __name__ == "__main__":
    main()
