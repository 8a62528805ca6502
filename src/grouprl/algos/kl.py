"""KL divergence estimators between the policy and the reference, and KL controllers.

With ``log_ratio = ref_logp - logp`` on tokens sampled from the policy, Schulman's estimators of
``KL(pi_theta || pi_ref)`` per token are

    k1 = -log_ratio                       unbiased, can be negative, high variance
    k2 = log_ratio**2 / 2                 biased, >= 0, low variance
    k3 = exp(log_ratio) - log_ratio - 1   unbiased, >= 0, low variance (DeepSeekMath's choice)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grouprl.registry import Registry

KL_ESTIMATORS: Registry = Registry("KL estimator")
"""name -> ``fn(logp [B,T], ref_logp [B,T]) -> kl [B,T]`` (float32)."""

_MAX_LOG_RATIO = 20.0
"""Beyond exp(20) k3 would overflow in bf16/fp16 and dominate the loss."""


def _log_ratio(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return (ref_logp.float() - logp.float()).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)


@KL_ESTIMATORS.register("k1")
def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return -_log_ratio(logp, ref_logp)


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return _log_ratio(logp, ref_logp).square() / 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    d = _log_ratio(logp, ref_logp)
    return torch.expm1(d) - d  # exp(d) - d - 1, without cancellation near d = 0


def kl_per_token(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL estimate ``[B,T]`` from policy and reference log-probs ``[B,T]`` of the sampled tokens.

    >>> kl_per_token(torch.log(torch.tensor([[0.4]])), torch.log(torch.tensor([[0.5]]))).item()  # doctest: +ELLIPSIS
    0.02685...
    """
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and ref_logp {tuple(ref_logp.shape)} differ in shape")
    return KL_ESTIMATORS.get(estimator)(logp, ref_logp)


@dataclass
class FixedKLController:
    """A constant KL coefficient beta."""

    beta: float

    def update(self, current_kl: float, n_steps: int) -> float:
        return self.beta

    def state_dict(self) -> dict:
        return {"beta": self.beta}

    def load_state_dict(self, state: dict) -> None:
        self.beta = float(state["beta"])


@dataclass
class AdaptiveKLController:
    """Adaptive beta of Ziegler et al. 2019 ("Fine-Tuning LMs from Human Preferences"): after each batch
    ``error = clip(kl / target - 1, -0.2, 0.2)``, ``beta *= 1 + error * n_steps / horizon``.

    >>> c = AdaptiveKLController(beta=0.1, target=6.0, horizon=10000)
    >>> round(c.update(current_kl=12.0, n_steps=256), 6)  # error clipped to +0.2
    0.100512
    """

    beta: float
    target: float
    horizon: int

    def update(self, current_kl: float, n_steps: int) -> float:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.beta *= 1.0 + error * n_steps / self.horizon
        return self.beta

    def state_dict(self) -> dict:
        return {"beta": self.beta, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict) -> None:
        self.beta, self.target, self.horizon = float(state["beta"]), float(state["target"]), int(state["horizon"])
