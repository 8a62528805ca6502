"""TRPO's update for language models (Schulman et al. 2015): one natural-gradient step per rollout.

    maximise  J(theta) = agg_{i,t}[ rho_it * A_it ] - beta * agg[KL_ref]      (rho = pi_theta / pi_old)
    g = grad J at theta_old;  F = Hessian of  mean_t KL(pi_old(.|s_t) || pi_theta(.|s_t))
    x = F^-1 g by conjugate gradient on Fisher-vector products (double backprop through the KL)
    step = sqrt(2 delta / x^T F x) * x, halved until J improves and the mean KL <= delta

The KL is exact over the vocabulary (not a sampled-token estimate), so F is the true, positive semi-definite
Fisher matrix. The surrogate is GRPO's aggregation of rho * A: the same objective up to the clip."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from grouprl.algos import aggregate, fisher_vector_product, flat_grad, kl_per_token, masked_mean, trpo_step
from grouprl.errors import NonFiniteError
from grouprl.rollout.logprobs import padded_features
from grouprl.trainer.config import TrainerConfig
from grouprl.trainer.policy import PolicyPasses
from grouprl.trainer.update import UpdateBatch
from grouprl.types import RolloutBatch


def full_logprobs(model: torch.nn.Module, batch: RolloutBatch, rows: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-softmax over the whole vocabulary at every counted completion position of ``rows``:
    ``[n, V]`` float32, n = number of 1s in ``completion_mask[rows]``, in row-major order."""
    where = (batch.completion_mask[rows].reshape(-1) > 0).nonzero().flatten()  # [n]
    feats, head, _ = padded_features(model, batch.prompt_ids[rows], batch.prompt_mask[rows],
                                     batch.completion_ids[rows], where)  # the LM head only where it counts
    return torch.log_softmax(head(feats).float() / temperature, dim=-1)


def _token_values(batch: RolloutBatch, rows: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """``[b, T]`` log-probs of the sampled tokens of ``rows`` picked out of ``full [n, V]`` (0 elsewhere)."""
    where = batch.completion_mask[rows] > 0
    picked = full.gather(-1, batch.completion_ids[rows][where][:, None])[:, 0]
    return torch.zeros(where.shape, dtype=full.dtype).masked_scatter(where, picked)


class _Surrogate:
    """TRPO's surrogate and trust-region KL, micro-batch by micro-batch, with the whole batch's denominators."""

    def __init__(self, config: TrainerConfig, data: UpdateBatch, beta: float):
        c, mask = config, data.mask
        self.config, self.data, self.beta = config, data, beta
        self.adv = data.advantages if data.advantages.dim() == 2 else data.advantages.unsqueeze(-1).expand_as(mask)
        self.agg = dict(mode=c.aggregation, max_tokens=c.max_new_tokens, group_size=c.group_size,
                        num_rows=float((mask.sum(-1) > 0).sum()), num_tokens=float(mask.sum()))

    def objective(self, rows: torch.Tensor, full: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        """This micro-batch's piece of J: agg(rho * A) - beta * agg(KL_ref)."""
        d, mask = self.data, self.data.mask[rows]
        logp = _token_values(d.rollout, rows, full)
        j = aggregate(torch.exp(logp - _token_values(d.rollout, rows, old)) * self.adv[rows], mask, **self.agg)
        if d.ref_logp is not None and self.beta:
            kl = kl_per_token(logp, d.ref_logp[rows], self.config.kl_estimator)
            j = j - self.beta * aggregate(kl, mask, **self.agg)
        return j

    def mean_kl(self, rows: torch.Tensor, full: torch.Tensor, old: torch.Tensor, tokens: float) -> torch.Tensor:
        """Sum over rows' counted positions of KL(old || full), divided by ``tokens``."""
        batch = self.data.rollout
        keep = (self.data.mask[rows][batch.completion_mask[rows] > 0] > 0).to(full.dtype)  # [n] positions in the loss
        return ((old.exp() * (old - full)).sum(-1) * keep).sum() / max(tokens, 1.0)


class TrustRegionUpdate:
    """One natural-gradient step on the whole rollout; holds no optimizer."""

    def __init__(self, config: TrainerConfig, passes: PolicyPasses, processes: Any, critic: Any = None):
        self.config, self.passes = config, passes

    def checkpoint_parts(self) -> dict[str, Any]:
        return {}

    def update(self, data: UpdateBatch, step: int, beta: float) -> dict[str, float]:
        """The step on ``data`` (pi_old's full distributions are recomputed exactly here)."""
        c, t0, policy, batch, mask = self.config, time.perf_counter(), self.passes.policy, data.rollout, data.mask
        if float(mask.sum()) == 0:
            return {"optim/skipped": 1.0}
        policy.eval()  # no dropout: the line search must see the same function as the gradient
        params = [p for p in policy.parameters() if p.requires_grad]
        micros = list(torch.arange(batch.batch_size).split(c.micro_batch_size))
        temperature = c.temperature if c.temperature > 0 else 1.0
        surrogate = _Surrogate(c, data, beta)
        # 1. g = grad J at theta_old; the old full distributions come from the same forward passes
        g, j_old, olds = torch.zeros(sum(p.numel() for p in params)), 0.0, []
        for rows in micros:
            full = full_logprobs(policy, batch, rows, temperature)
            olds.append(full.detach())
            j = surrogate.objective(rows, full, olds[-1])
            g += flat_grad(j, params)
            j_old += float(j.detach())
        if not torch.isfinite(g).all():
            raise NonFiniteError("the surrogate's gradient is not finite: the step was not taken")
        times = {"grad": time.perf_counter()}
        # 2. Fisher-vector products through the exact KL on every fisher_stride-th row
        fisher_rows = torch.arange(0, batch.batch_size, c.fisher_stride)
        fisher_tokens = float(mask[fisher_rows].sum())
        products: list[Callable[[torch.Tensor], torch.Tensor]] = []
        for rows in fisher_rows.split(c.micro_batch_size):
            with sdpa_kernel(SDPBackend.MATH):  # the fused CPU attention kernels have no double backward
                full = full_logprobs(policy, batch, rows, temperature)
            products.append(fisher_vector_product(surrogate.mean_kl(rows, full, full.detach(), fisher_tokens), params,
                                                  0.0))
        calls = [0]

        def fvp(v: torch.Tensor) -> torch.Tensor:
            calls[0] += 1
            return sum(p(v) for p in products) + c.damping * v

        def solved() -> None:
            products.clear()  # frees the double-backprop graphs before the line search
            times["cg"] = time.perf_counter()

        # 3. conjugate gradient, then a backtracking line search on the exact surrogate and KL
        def evaluate(step_: torch.Tensor) -> tuple[float, float]:
            with torch.no_grad():
                j, kl = 0.0, 0.0
                for rows, old in zip(micros, olds):
                    full = full_logprobs(policy, batch, rows, temperature)
                    j += float(surrogate.objective(rows, full, old))
                    kl += float(surrogate.mean_kl(rows, full, old, surrogate.agg["num_tokens"]))
            return j - j_old, kl

        _, metrics = trpo_step(params, g, fvp, evaluate, max_kl=c.max_kl, cg_iters=c.cg_iters,
                               backtracks=c.backtracks, accept_ratio=c.accept_ratio, solved=solved)
        metrics.update({"trpo/fvp_calls": float(calls[0]), "trpo/params": float(g.numel()), "loss/policy": -j_old,
                        "trpo/seconds_grad": times["grad"] - t0, "trpo/seconds_cg": times["cg"] - times["grad"],
                        "trpo/seconds_line_search": time.perf_counter() - times["cg"]})
        if data.ref_logp is not None:
            logp = torch.cat([_token_values(batch, r, o) for r, o in zip(micros, olds)])
            metrics["policy/kl"] = float(masked_mean(kl_per_token(logp, data.ref_logp, c.kl_estimator), mask))
        return metrics
