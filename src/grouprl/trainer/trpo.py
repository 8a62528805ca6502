"""TRPO trainer for language models (Schulman et al. 2015) on the GRPO trainer's machinery.

Rollout, rewards and advantages are GRPO's (group-relative by default; any estimator of
``advantage``), so the comparison isolates the update rule. The update is one natural-gradient
step per rollout instead of mu passes of clipped Adam steps:

    maximise  J(theta) = agg_{i,t}[ rho_it * A_it ] - beta * agg[KL_ref]      (rho = pi_theta / pi_old)
    g = grad J at theta_old;  F = Hessian of  mean_t KL(pi_old(.|s_t) || pi_theta(.|s_t))
    x = F^-1 g by conjugate gradient on Fisher-vector products (double backprop through the KL)
    step = sqrt(2 delta / x^T F x) * x, halved until J improves and the mean KL <= delta

The KL is exact over the vocabulary at every completion position (not a sampled-token estimate),
so F is the true Fisher matrix of the per-token distributions and is positive semi-definite.

Cost, honestly: every CG iteration is one backward pass through the double-backprop graph of the
Fisher rows, about a forward+backward of the model each, and that graph (activations plus
first-order gradients of the whole Fisher batch) stays in memory for the whole solve; the line
search adds one forward pass per trial step, and the old policy's full log-softmax ``[tokens, V]``
is kept for the exact KL. Measured on one update of the same rollout (2-core CPU, one thread,
``benchmarks/results/trpo_cost.md``), with ``cg_iters=10``: SmolLM2-135M with LoRA rank 8 takes
307 s against GRPO's 31 s (10x) at 2.5x GRPO's peak memory; fully fine-tuned, 585 s (19x) and
9.9 GiB peak (3.2x). ``fisher_stride`` (OpenAI baselines used every 5th sample for the Fisher)
and LoRA are the levers.

Departures: the surrogate is GRPO's aggregation of rho * A (not a plain mean over tokens), so
the two trainers optimise the same objective up to the clip; there is no value function.

Example::

    from grouprl.trainer.trpo import TRPOConfig, TRPOTrainer
    from grouprl.models import load_policy
    policy, tok = load_policy("smollm2-135m")
    def short(prompts, completions, **_): return [-len(c) / 100 for c in completions]
    TRPOTrainer(TRPOConfig(total_steps=10, lora_rank=8), policy=policy, tokenizer=tok, reward_fns=[short],
                train_data=[{"prompt": "Say hi."}] * 8).train()
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from grouprl.algos import (
    aggregate,
    backtracking_line_search,
    conjugate_gradient,
    fisher_vector_product,
    flat_grad,
    get_flat_params,
    kl_per_token,
    masked_mean,
    natural_step_size,
    set_flat_params,
)
from grouprl.rollout.logprobs import split_model
from grouprl.rollout.runner import positions_from_mask
from grouprl.trainer.config import GRPOConfig
from grouprl.trainer.grpo import GRPOTrainer
from grouprl.types import RolloutBatch


@dataclass
class TRPOConfig(GRPOConfig):
    """GRPO's rollout and advantage knobs; the update is a natural-gradient step (lr, mu, minibatches,
    clip ranges and the optimizer are unused)."""

    max_kl: float = 0.01
    """Trust-region radius delta: the mean over completion tokens of KL(pi_old || pi_new)."""
    damping: float = 0.1
    """Added to the Fisher matrix, (F + damping I): keeps conjugate gradient stable where F is
    near-singular (it always is for a language model: far more parameters than samples)."""
    cg_iters: int = 10
    """Conjugate-gradient iterations, each one Fisher-vector product (one extra backward pass)."""
    backtracks: int = 10
    """Line-search halvings of the step before the update is skipped."""
    accept_ratio: float = 0.1
    """A step is accepted if its improvement is at least this fraction of the linear prediction."""
    fisher_stride: int = 1
    """Use every k-th row of the rollout for the Fisher-vector products: k times less memory and
    Fisher compute for a noisier curvature estimate (OpenAI baselines' TRPO used k = 5)."""

    def validate(self) -> None:
        super().validate()
        if self.mu != 1 or self.minibatch_rows != self.rollout_rows:
            raise ValueError("TRPO takes one natural-gradient step per rollout: set mu=1 and leave minibatch_size "
                             "empty")
        if self.max_kl <= 0 or self.damping < 0 or self.cg_iters < 1 or self.backtracks < 1 or self.fisher_stride < 1:
            raise ValueError("max_kl must be > 0, damping >= 0, and cg_iters, backtracks, fisher_stride >= 1")
        if self.gradient_checkpointing:
            raise ValueError("gradient_checkpointing is not available with TRPO: its Fisher-vector products "
                             "differentiate twice through the forward pass")


def full_logprobs(model: torch.nn.Module, batch: RolloutBatch, rows: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-softmax over the whole vocabulary at every counted completion position of ``rows``:
    ``[n, V]`` float32, n = number of 1s in ``completion_mask[rows]``, in row-major order."""
    p_ids, c_ids, c_mask = batch.prompt_ids[rows], batch.completion_ids[rows], batch.completion_mask[rows]
    lp, t = p_ids.shape[1], c_ids.shape[1]
    ids = torch.cat([p_ids, c_ids], 1)
    attn = torch.cat([batch.prompt_mask[rows].long(), torch.ones_like(c_ids)], 1)
    kwargs = dict(input_ids=ids, attention_mask=attn, position_ids=positions_from_mask(attn), use_cache=False)
    where = c_mask > 0  # [b, T]
    parts = split_model(model)
    if parts is not None:  # the LM head only on the positions that count
        body, head = parts
        logits = head(body(**kwargs).last_hidden_state[:, lp - 1: lp + t - 1][where])
    else:
        logits = model(**kwargs).logits[:, lp - 1: lp + t - 1][where]
    return torch.log_softmax(logits.float() / temperature, dim=-1)


class TRPOTrainer(GRPOTrainer):
    """TRPO on the GRPO trainer's rollout and advantages; see the module docstring."""

    name = "trpo"

    def update(self, batch: RolloutBatch, advantages: torch.Tensor, old_logp: torch.Tensor | None,
               ref_logp: torch.Tensor | None, mask: torch.Tensor,
               extras: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
        """One natural-gradient step on the whole rollout (``old_logp`` is recomputed exactly here)."""
        c, t0 = self.config, time.perf_counter()
        self.policy.eval()  # no dropout: the line search must see the same function as the gradient
        params = [p for p in self.policy.parameters() if p.requires_grad]
        micros = list(torch.arange(batch.batch_size).split(c.micro_batch_size))
        totals = dict(num_rows=float((mask.sum(-1) > 0).sum()), num_tokens=float(mask.sum()))
        if totals["num_tokens"] == 0:
            return {"optim/skipped": 1.0}
        adv = advantages if advantages.dim() == 2 else advantages.unsqueeze(-1).expand_as(mask)  # [B, T]
        temperature = c.temperature if c.temperature > 0 else 1.0

        def objective(rows: torch.Tensor, full: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
            """This micro-batch's piece of J: agg(rho * A) - beta * agg(KL_ref), global denominators."""
            m = mask[rows]
            where = batch.completion_mask[rows] > 0
            tokens = batch.completion_ids[rows][where]
            logp = torch.zeros(m.shape, dtype=full.dtype).masked_scatter(where, full.gather(-1, tokens[:, None])[:, 0])
            old_tok = torch.zeros(m.shape, dtype=old.dtype).masked_scatter(where, old.gather(-1, tokens[:, None])[:, 0])
            agg = dict(mode=c.aggregation, max_tokens=c.max_new_tokens, group_size=c.group_size, **totals)
            j = aggregate(torch.exp(logp - old_tok) * adv[rows], m, **agg)
            if ref_logp is not None and self.loss_beta():
                j = j - self.loss_beta() * aggregate(kl_per_token(logp, ref_logp[rows], c.kl_estimator), m, **agg)
            return j

        def mean_kl(rows: torch.Tensor, full: torch.Tensor, old: torch.Tensor, tokens: float) -> torch.Tensor:
            """Sum over rows' counted positions of KL(old || full), divided by ``tokens``."""
            keep = (mask[rows][batch.completion_mask[rows] > 0] > 0).to(full.dtype)  # [n] positions in the loss
            return ((old.exp() * (old - full)).sum(-1) * keep).sum() / max(tokens, 1.0)

        # 1. g = grad J at theta_old; the old full distributions come from the same forward passes
        g, j_old, olds = torch.zeros(sum(p.numel() for p in params)), 0.0, []
        for rows in micros:
            full = full_logprobs(self.policy, batch, rows, temperature)
            olds.append(full.detach())
            j = objective(rows, full, olds[-1])
            g += flat_grad(j, params)
            j_old += float(j.detach())
        t_grad = time.perf_counter()
        # 2. Fisher-vector products through the exact KL on every fisher_stride-th row
        fisher_rows = torch.arange(0, batch.batch_size, c.fisher_stride)
        fisher_tokens = float(mask[fisher_rows].sum())
        products: list[Callable[[torch.Tensor], torch.Tensor]] = []
        for rows in fisher_rows.split(c.micro_batch_size):
            with sdpa_kernel(SDPBackend.MATH):  # the fused CPU attention kernels have no double backward
                full = full_logprobs(self.policy, batch, rows, temperature)
            products.append(fisher_vector_product(mean_kl(rows, full, full.detach(), fisher_tokens), params, 0.0))
        calls = [0]

        def fvp(v: torch.Tensor) -> torch.Tensor:
            calls[0] += 1
            return sum(p(v) for p in products) + c.damping * v

        direction = conjugate_gradient(fvp, g, c.cg_iters)
        full_step = natural_step_size(direction, fvp(direction), c.max_kl) * direction
        products.clear()  # frees the double-backprop graphs before the line search
        t_cg = time.perf_counter()
        # 3. backtracking line search on the exact surrogate and KL
        theta_old = get_flat_params(params)

        def evaluate(step: torch.Tensor) -> tuple[float, float]:
            set_flat_params(params, theta_old + step)
            with torch.no_grad():
                j, kl = 0.0, 0.0
                for rows, old in zip(micros, olds):
                    full = full_logprobs(self.policy, batch, rows, temperature)
                    j += float(objective(rows, full, old))
                    kl += float(mean_kl(rows, full, old, totals["num_tokens"]))
            return j - j_old, kl

        step, metrics = backtracking_line_search(evaluate, full_step, float(g.dot(full_step)), c.max_kl, c.backtracks,
                                                 accept_ratio=c.accept_ratio)
        set_flat_params(params, theta_old + step)
        metrics.update({"trpo/fvp_calls": float(calls[0]), "trpo/params": float(len(theta_old)),
                        "trpo/grad_norm": float(g.norm()), "trpo/step_norm": float(step.norm()),
                        "loss/policy": -j_old, "trpo/seconds_grad": t_grad - t0, "trpo/seconds_cg": t_cg - t_grad,
                        "trpo/seconds_line_search": time.perf_counter() - t_cg})
        if ref_logp is not None:
            old_tokens = torch.cat([o.gather(-1, batch.completion_ids[r][batch.completion_mask[r] > 0][:, None])[:, 0]
                                    for r, o in zip(micros, olds)])
            logp = torch.zeros_like(mask).masked_scatter(batch.completion_mask > 0, old_tokens)
            metrics["policy/kl"] = float(masked_mean(kl_per_token(logp, ref_logp, c.kl_estimator), mask))
        return metrics
