"""PPO trainer for language models (Schulman et al. 2017; the RLHF form of Ziegler et al. 2019 and
Ouyang et al. 2022), on the GRPO trainer's rollout, reward, log-prob, update and checkpoint code.

One step: sample P prompts x G completions -> rewards -> token rewards (the outcome reward on each
completion's last token, minus beta * KL_t to the reference on every token) -> critic values ->
GAE(gamma, lambda) advantages and returns -> whiten -> mu passes of minibatch updates of
``clip loss + c_v * clipped value loss - c_H * entropy`` -> adapt beta to the measured KL.

Where this departs from the papers, and why:
- Completions are still drawn G per prompt (the shared sampler's shape), but nothing in the
  advantage looks at the groups: the baseline is the critic. G = 1 is not allowed by the shared
  config; comparisons with GRPO use the same P and G so both see the same number of samples.
- The critic is a value head on a copy of the policy's decoder (``critic_model: copy``) or on a
  separate model; it has its own AdamW (``critic_lr``) while the gradient norm is clipped over policy
  and critic together, so c_v sets the value loss's share of that norm. Policy and critic share no
  parameters, so unlike a shared-trunk PPO, c_v does not trade the two objectives off.
- Rows whose reward is None (no reward function applied) are left out of the loss.

Example::

    from grouprl.trainer.ppo import PPOConfig, PPOTrainer
    from grouprl.models import load_policy
    policy, tok = load_policy("smollm2-135m")
    def short(prompts, completions, **_): return [-len(c) / 100 for c in completions]
    PPOTrainer(PPOConfig(total_steps=10), policy=policy, tokenizer=tok, reward_fns=[short],
               train_data=[{"prompt": "Say hi."}] * 8).train()
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model

from grouprl.algos import AdaptiveKLController, FixedKLController, aggregate, gae, kl_per_token, value_loss, whiten
from grouprl.models import load_policy
from grouprl.registry import Registry
from grouprl.trainer.config import GRPOConfig
from grouprl.trainer.critic import ValueModel, make_critic
from grouprl.trainer.grpo import GRPOTrainer
from grouprl.trainer.metrics import PhaseTimer
from grouprl.trainer.optim import build_optimizer
from grouprl.types import RolloutBatch

KL_CONTROLLERS: Registry = Registry("KL controller")
"""name -> ``fn(config) -> controller`` with ``beta``, ``update(kl, n)`` and state_dict."""
KL_CONTROLLERS.register("fixed", lambda c: FixedKLController(c.beta))
KL_CONTROLLERS.register("adaptive", lambda c: AdaptiveKLController(c.beta, c.kl_target, c.kl_horizon))


@dataclass
class PPOConfig(GRPOConfig):
    """Every GRPO knob (sampling, batch shape, clipping, aggregation, run folder) plus the critic's."""

    beta: float = 0.05
    """Initial KL coefficient to the reference (TRL's PPO init_kl_coef 0.05; InstructGPT 0.02)."""
    kl_in_reward: bool = True
    """PPO-RLHF's placement: -beta * KL_t is a reward on every token t, so GAE spreads the penalty
    over the positions that incurred it. False puts beta * KL in the loss, as GRPO does. Off when
    beta is 0 (there is no penalty to place)."""
    kl_controller: str = "adaptive"
    """fixed: beta stays at its initial value. adaptive: Ziegler et al.'s proportional controller
    moves beta so that the per-sequence KL tracks kl_target."""
    kl_target: float = 6.0
    """Target per-sequence KL (sum over tokens) of the adaptive controller (Ziegler et al. 6.0)."""
    kl_horizon: int = 10000
    """Horizon of the adaptive controller, in rows: beta changes by at most 20% per horizon."""
    gamma: float = 1.0
    """Discount over completion tokens (1: the outcome reward is not discounted; TRL and verl)."""
    gae_lambda: float = 0.95
    """GAE lambda (TRL 0.95; verl 1.0)."""
    whiten_advantages: bool = True
    """Whiten advantages over the batch's valid tokens (TRL, verl)."""
    vf_coef: float = 0.1
    """Value-loss coefficient c_v in loss = pg + c_v * vf - c_H * H (TRL 0.1)."""
    vf_clip: float | None = 0.2
    """Clip the change of each value prediction per update to this (TRL cliprange_value 0.2);
    empty = plain squared error."""
    critic_model: str = "copy"
    """copy: a value head on a copy of the policy's decoder (double the model memory). Otherwise a
    model to load (a bundled name or folder, same tokenizer) whose decoder carries the value head:
    a smaller critic costs less memory and compute."""
    critic_lr: float | None = None
    """AdamW learning rate of the critic; empty = lr. verl uses 10x the policy's."""
    critic_warmup_steps: int = 0
    """Steps at the start that train only the critic (the policy is not updated), so the first
    policy updates see a baseline that has already fitted the returns."""

    def __post_init__(self) -> None:
        if self.beta == 0:  # no KL penalty at all: there is nothing to place in the reward
            self.kl_in_reward = False
        super().__post_init__()

    def validate(self) -> None:
        super().validate()
        if self.kl_controller not in KL_CONTROLLERS:
            raise ValueError(f"kl_controller={self.kl_controller!r} is not one of: {', '.join(KL_CONTROLLERS)}")
        if not 0 < self.gamma <= 1 or not 0 <= self.gae_lambda <= 1:
            raise ValueError(f"gamma={self.gamma} must be in (0, 1] and gae_lambda={self.gae_lambda} in [0, 1]")
        if self.vf_coef < 0 or (self.vf_clip is not None and self.vf_clip <= 0):
            raise ValueError("vf_coef must be >= 0 and vf_clip > 0 (or empty)")
        if self.kl_target <= 0 or self.kl_horizon < 1 or self.critic_warmup_steps < 0:
            raise ValueError("kl_target must be > 0, kl_horizon >= 1 and critic_warmup_steps >= 0")


def token_rewards(rewards: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor, beta: float) -> torch.Tensor:
    """PPO-RLHF's token rewards ``[B, T]``: ``-beta * KL_t`` on every token plus the outcome reward
    ``rewards [B]`` on the last one (``kl [B, T]``, 0 on padding).

    >>> r = token_rewards(torch.tensor([1.]), torch.ones(1, 3), torch.tensor([[0.2, 0.1, 0.3]]), 0.1)
    >>> [round(x, 6) for x in r[0].tolist()]
    [-0.02, -0.01, 0.97]
    """
    return outcome_on_last_token(rewards, mask) - beta * kl * mask


def outcome_on_last_token(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` rewards -> ``[B, T]`` token rewards: each row's reward on its last valid token, 0
    elsewhere (and 0 for a NaN reward).

    >>> outcome_on_last_token(torch.tensor([2., 5.]), torch.tensor([[1., 1., 0.], [1., 1., 1.]])).tolist()
    [[0.0, 2.0, 0.0], [0.0, 0.0, 5.0]]
    """
    last = (mask.cumsum(-1) == mask.sum(-1, keepdim=True)) & (mask > 0)  # [B, T] one-hot of the last token
    return torch.where(last, torch.nan_to_num(rewards.float(), nan=0.0).unsqueeze(-1), torch.zeros_like(mask))


class PPOTrainer(GRPOTrainer):
    """PPO with a learned critic on the GRPO trainer's machinery; see the module docstring.

    Extra argument: ``critic_backbone``, a model whose decoder carries the value head (default: a
    copy of the policy's decoder, or ``config.critic_model`` loaded when it is not ``copy``).
    """

    name = "ppo"

    def __init__(self, config: PPOConfig, *, critic_backbone: torch.nn.Module | None = None, **kwargs: Any):
        if critic_backbone is None and config.critic_model != "copy":
            critic_backbone, _ = load_policy(config.critic_model)
        super().__init__(config, **kwargs)
        self.critic: ValueModel = make_critic(self.policy, critic_backbone)
        if config.gradient_checkpointing:
            self.critic.body.gradient_checkpointing_enable()
        c = config
        self.critic_optimizer, _ = build_optimizer(self.critic.parameters(), c.critic_lr or c.lr,
                                                   (c.adam_beta1, c.adam_beta2), c.weight_decay, 0, 1, "constant")
        self.kl_controller = KL_CONTROLLERS.get(c.kl_controller)(c)

    @property
    def warming_up(self) -> bool:
        return self.step_count < self.config.critic_warmup_steps

    # ---------------------------------------------------------------------------------------------
    def step(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """One PPO iteration, in the order of the module docstring. Returns (metrics, samples)."""
        c, timer, t0 = self.config, PhaseTimer(), time.perf_counter()
        batch, rewards, per_fn, rounds = self.sample_and_score(timer)             # o ~ pi_old, r
        mask = batch.completion_mask * (~torch.isnan(rewards)).unsqueeze(-1).to(batch.completion_mask.dtype)
        if c.mask_truncated:
            mask = mask * (~batch.truncated).unsqueeze(-1).to(mask.dtype)
        with timer("logprobs"):
            old_logp = self.logprobs(self.policy, batch)
            ref_logp = self.reference_logprobs(batch) if c.needs_reference else None
            values = self.critic_values(batch)                                   # V(s_t)
        beta = self.kl_controller.beta
        kl = torch.zeros_like(mask) if ref_logp is None else kl_per_token(old_logp, ref_logp, c.kl_estimator) * mask
        per_token = token_rewards(rewards, mask, kl, beta if c.kl_in_reward else 0.0)
        advantages, returns = gae(per_token, values, mask, c.gamma, c.gae_lambda)
        if c.whiten_advantages:
            advantages = whiten(advantages, mask)
        with timer("update"):
            update = self.update(batch, advantages, old_logp, None if c.kl_in_reward else ref_logp, mask,
                                 extras={"values": values, "returns": returns})
        sequence_kl = float(kl.sum(-1).mean())
        self.kl_controller.update(sequence_kl, batch.batch_size)
        metrics = {**self.reward_metrics(rewards, per_fn, torch.zeros(0, dtype=torch.bool)),
                   **self.rollout_metrics(batch, rounds), **update, **timer.metrics(),
                   **self.critic_metrics(kl, values, mask, beta), "time/step": time.perf_counter() - t0}
        metrics.pop("rollout/zero_std_frac")  # all-equal groups still carry signal here: the critic's baseline
        tokens = float(batch.completion_mask.sum())
        metrics["throughput/tokens_per_s"] = tokens / metrics["time/step"]
        metrics["throughput/rollout_tokens_per_s"] = tokens / max(timer.seconds.get("rollout", 0.0), 1e-9)
        row_adv = (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [B] mean advantage of each row
        return metrics, self.sample_records(batch, rewards, per_fn, row_adv)

    def critic_metrics(self, kl: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                       beta: float) -> dict[str, float]:
        tokens = mask.sum().clamp(min=1)
        return {"policy/kl": float(kl.sum() / tokens), "policy/kl_sequence": float(kl.sum(-1).mean()),
                "kl/beta": beta, "value/mean": float((values * mask).sum() / tokens),
                "critic/warmup": float(self.warming_up)}

    def critic_values(self, batch: RolloutBatch, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Critic values ``[B, T]`` (or of ``rows``, with grad); without rows, no grad, in micro-batches."""
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.config.dtype == "bf16")
        pick = lambda r: (batch.prompt_ids[r], batch.prompt_mask[r], batch.completion_ids[r], batch.completion_mask[r])
        if rows is not None:
            with autocast:
                return self.critic(*pick(rows))
        self.critic.eval()
        with torch.no_grad(), autocast:
            return torch.cat([self.critic(*pick(chunk))
                              for chunk in torch.arange(batch.batch_size).split(self.config.micro_batch_size)])

    # -- the update: GRPOTrainer.update's loop with PPO's loss and a second optimizer -------------
    def micro_loss(self, batch: RolloutBatch, micro: torch.Tensor, inputs: dict[str, torch.Tensor | None],
                   n_rows: float, n_tokens: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        c = self.config
        mask = inputs["mask"][micro]
        self.critic.train()
        vl, metrics = value_loss(self.critic_values(batch, micro), inputs["values"][micro], inputs["returns"][micro],
                                 mask, c.vf_clip)
        value_term = c.vf_coef * aggregate(vl, mask, c.aggregation, max_tokens=c.max_new_tokens,
                                           group_size=c.group_size, num_rows=n_rows, num_tokens=n_tokens)
        metrics["loss/value"] = value_term.detach()
        if self.warming_up:  # only the critic learns; no policy forward at all
            return value_term, metrics
        loss, policy_metrics = super().micro_loss(batch, micro, inputs, n_rows, n_tokens)
        total = loss + value_term
        return total, {**policy_metrics, **metrics, "loss/total": total.detach()}

    def loss_beta(self) -> float:
        return 0.0 if self.config.kl_in_reward else self.kl_controller.beta

    def optimizer_step(self) -> float:
        """Clip the joint gradient norm of policy and critic, step both (the policy not while the critic
        warms up), and clear the critic's gradients (GRPOTrainer.update clears only the policy's)."""
        c = self.config
        params = [p for m in (self.policy, self.critic) for p in m.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, c.max_grad_norm if c.max_grad_norm > 0 else float("inf"))
        if not self.warming_up:  # the policy's schedule starts with its first step
            self.optimizer.step()
            self.scheduler.step()
        self.critic_optimizer.step()
        self.critic_optimizer.zero_grad(set_to_none=True)
        return float(norm)

    # -- checkpoints ------------------------------------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        return {"kl_controller": self.kl_controller.state_dict()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.kl_controller.load_state_dict(state["kl_controller"])

    def extra_files(self) -> dict[str, Callable[[Path], None]]:
        return {"critic.safetensors": lambda path: save_model(self.critic, str(path)),
                "critic_optimizer.pt": lambda path: torch.save(self.critic_optimizer.state_dict(), path)}

    def load_extra_files(self, folder: Path) -> None:
        load_model(self.critic, str(folder / "critic.safetensors"))
        self.critic_optimizer.load_state_dict(torch.load(folder / "critic_optimizer.pt", weights_only=False))
