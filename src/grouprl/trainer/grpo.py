"""GRPO trainer (Shao et al. 2024, "DeepSeekMath", section 4).

One step: sample P prompts -> G completions each -> rewards -> group-relative advantages ->
mu passes of minibatch updates of the clipped surrogate with a k3 KL penalty to the reference.

Where this departs from the paper, and why:
- Outcome supervision only (one reward per completion, broadcast to its tokens); the paper's
  process supervision needs a step-level reward model that users rarely have.
- When the update is on-policy (mu = 1, one minibatch) no old-policy forward is run: the ratio
  is ``exp(logp - logp.detach())``, 1 in value with exactly the REINFORCE gradient.
- The aggregation, the advantage scale and the importance level are knobs (the paper's choices
  are the defaults), because later work (DAPO, Dr. GRPO, GSPO) showed the paper's choices are
  not always the best; see ``GRPOConfig``.
- Rewards of ``None`` (a function that does not apply to a row) are excluded from the group
  statistics instead of being counted as 0.

Example::

    from grouprl import GRPOConfig, GRPOTrainer
    from grouprl.models import load_policy
    policy, tok = load_policy("smollm2-135m")
    def short(prompts, completions, **_): return [-len(c) / 100 for c in completions]
    GRPOTrainer(GRPOConfig(total_steps=10), policy=policy, tokenizer=tok, reward_fns=[short],
                train_data=[{"prompt": "Say hi."}] * 8).train()
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from grouprl.algos import compute_advantages, constant_groups, grpo_loss, kl_per_token
from grouprl.algos.rollout_correction import rollout_mismatch, truncated_is_weights
from grouprl.models import LoraSettings, apply_lora, is_peft, make_reference, reference_context
from grouprl.rewards import score_rewards
from grouprl.rollout.logprobs import token_logprobs
from grouprl.trainer.base import BaseTrainer
from grouprl.trainer.config import GRPOConfig
from grouprl.trainer.metrics import PhaseTimer
from grouprl.types import RolloutBatch


class MetricAverager:
    """Averages per-micro-batch metrics: ``loss/*`` are already globally normalised pieces of one
    minibatch loss and are summed within an optimizer step; the rest are token-weighted means."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.optimizer_steps = 0

    def add(self, metrics: dict[str, torch.Tensor], tokens: float) -> None:
        for k, v in metrics.items():
            v = float(v)
            if k.startswith("loss/"):
                self.sums[k] = self.sums.get(k, 0.0) + v
                self.weights[k] = 1.0
            else:
                self.sums[k] = self.sums.get(k, 0.0) + v * tokens
                self.weights[k] = self.weights.get(k, 0.0) + tokens

    def result(self) -> dict[str, float]:
        steps = max(1, self.optimizer_steps)
        return {k: (v / steps if k.startswith("loss/") or k.startswith("optim/") else v / max(self.weights[k], 1e-12))
                for k, v in self.sums.items()}


class GRPOTrainer(BaseTrainer):
    """Group Relative Policy Optimization on a Hugging Face causal LM.

    Args:
        config: a :class:`GRPOConfig`.
        policy, tokenizer: the model to train (any ``AutoModelForCausalLM``) and its tokenizer.
        reward_fns: callables ``(prompts, completions, *, completion_ids, **columns) -> list[float | None]``.
        train_data / eval_data: rows (dicts) with a ``prompt`` (text or chat messages); every other
            column is passed to the reward functions.
        reward_weights: one weight per reward function (default 1 each).
        is_correct: ``(completion, row) -> bool`` for evaluation accuracy (a task's checker).
        reference: a frozen reference model; by default a copy of the policy (none with LoRA).
        sampler: a rollout engine with ``generate`` (default: the built-in KV-cache engine).
    """

    name = "grpo"

    def __init__(self, config: GRPOConfig, *, policy: torch.nn.Module, tokenizer: Any,
                 reward_fns: Sequence[Callable], train_data: Sequence[dict], eval_data: Sequence[dict] | None = None,
                 reward_weights: Sequence[float] | None = None, is_correct: Callable[[str, dict], bool] | None = None,
                 reference: torch.nn.Module | None = None, sampler: Any = None, system_prompt: str | None = None,
                 run_config: Any = None):
        if config.lora_rank and not is_peft(policy):
            policy = apply_lora(policy, LoraSettings(rank=config.lora_rank, alpha=config.lora_alpha,
                                                     dropout=config.lora_dropout,
                                                     target_modules=tuple(config.lora_target_modules)))
        if config.gradient_checkpointing:
            policy.gradient_checkpointing_enable()
        if config.needs_reference and reference is None and not is_peft(policy):
            reference = make_reference(policy, torch.bfloat16 if config.ref_dtype == "bf16" else None)
        self.reference = reference
        super().__init__(config, policy=policy, tokenizer=tokenizer, reward_fns=reward_fns, train_data=train_data,
                         eval_data=eval_data, reward_weights=reward_weights, is_correct=is_correct, sampler=sampler,
                         system_prompt=system_prompt, run_config=run_config)
        self.stop_ids = tuple(i for i in [tokenizer.eos_token_id] if i is not None)

    def optimizer_steps_per_step(self) -> int:
        return self.config.mu * (self.config.rollout_rows // self.config.minibatch_rows)

    def reference_to_save(self) -> torch.nn.Module | None:
        return self.reference if self.config.ref_sync_steps else None

    # ---------------------------------------------------------------------------------------------
    def step(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """One GRPO iteration, in the paper's order. Returns (metrics, sample completions)."""
        c, timer, t0 = self.config, PhaseTimer(), time.perf_counter()
        batch, rewards, per_fn, rounds = self.sample_and_score(timer)           # o_i ~ pi_old(.|q), r_i
        mask = batch.completion_mask.clone()
        with timer("logprobs"):
            old_logp = self.logprobs(self.policy, batch) if c.needs_old_logprobs else None
            ref_logp = self.reference_logprobs(batch) if c.needs_reference else None
        if c.kl_in_reward:                                                      # r_i - beta * KL_i
            rewards = rewards - c.beta * (kl_per_token(old_logp, ref_logp, c.kl_estimator) * mask).sum(-1)
        advantages = self.advantages(rewards)
        constant = _constant_groups(rewards, c.group_size)
        if c.mask_truncated:
            mask = mask * (~batch.truncated).unsqueeze(-1).to(mask.dtype)
        if c.zero_std_groups == "drop":
            mask = mask * (~constant).unsqueeze(-1).to(mask.dtype)
        weighted, correction = self.rollout_correction(batch, old_logp, advantages, mask)
        with timer("update"):                                                   # mu x minibatches
            update = self.update(batch, weighted, old_logp, None if c.kl_in_reward else ref_logp, mask)
        if c.ref_sync_steps and (self.step_count + 1) % c.ref_sync_steps == 0:
            self.sync_reference()
        metrics = {
            **self.reward_metrics(rewards, per_fn, constant), **self.rollout_metrics(batch, rounds),
            **update, **correction, **timer.metrics(), "time/step": time.perf_counter() - t0,
        }
        tokens = float(batch.completion_mask.sum())
        metrics["throughput/tokens_per_s"] = tokens / metrics["time/step"]
        metrics["throughput/rollout_tokens_per_s"] = tokens / max(timer.seconds.get("rollout", 0.0), 1e-9)
        return metrics, self.sample_records(batch, rewards, per_fn, advantages)

    # -- what a multi-process trainer changes (grouprl.trainer.dist_grpo) ---------------------------
    def take_prompts(self, count: int) -> list[int]:
        """Indices of the next ``count`` training prompts."""
        return self.stream.take(count)

    def advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        """``[B]`` advantages of ``rewards [B]`` by the configured estimator and scale."""
        c = self.config
        return compute_advantages(c.advantage, rewards, c.group_size, c.advantage_scale, c.advantage_eps)

    def minibatch_groups(self) -> int:
        """Groups per minibatch in this process."""
        return self.config.minibatch_rows // self.config.group_size

    def loss_denominators(self, mask: torch.Tensor) -> tuple[float, float]:
        """(rows with a counted token, counted tokens) of a minibatch's ``mask [b, T]``: the
        denominators that every micro-batch's loss shares."""
        return float((mask.sum(-1) > 0).sum()), float(mask.sum())

    def rollout_correction(self, batch: RolloutBatch, old_logp: torch.Tensor | None, advantages: torch.Tensor,
                           mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """With ``rollout_is`` on, weight each token's policy-gradient term by the capped ratio
        pi_old / pi_rollout (see :mod:`grouprl.algos.rollout_correction`): ``advantages [B]`` become
        ``[B, T]``. Logs the rollout engine's mismatch KL whenever pi_old was computed."""
        c = self.config
        if old_logp is None:
            return advantages, {}
        rollout_logp = batch.sampling_logprobs.to(old_logp.device)
        if c.rollout_is == "none":
            return advantages, {k: float(v) for k, v in rollout_mismatch(old_logp, rollout_logp, mask).items()}
        weights, m = truncated_is_weights(old_logp, rollout_logp, mask, level=c.rollout_is, cap=c.rollout_is_cap)
        return advantages.unsqueeze(-1) * weights, {k: float(v) for k, v in m.items()}

    # -- rollout and rewards ----------------------------------------------------------------------
    def sample_and_score(self, timer: PhaseTimer) -> tuple[RolloutBatch, torch.Tensor, dict, int]:
        """P groups of G completions with their rewards. Under dynamic sampling, all-equal groups are
        dropped and more prompts sampled, up to ``dynamic_sampling_max_rounds`` rounds."""
        c = self.config
        kept: list[tuple[RolloutBatch, torch.Tensor, dict]] = []
        have, rounds = 0, 0
        params = c.sampling_params(self.stop_ids)
        while rounds < (c.dynamic_sampling_max_rounds if c.dynamic_sampling else 1) and have < c.prompts_per_step:
            idx = self.take_prompts(c.prompts_per_step)
            rows = [self.train_rows[i] for i in idx]
            columns = {k: [r.get(k) for r in rows] for k in rows[0] if k != "prompt"}
            self.policy.eval()
            with timer("rollout"):
                batch = self.sampler.generate([self.train_ids[i] for i in idx], c.group_size, params,
                                              seed=_mix(c.seed, self.step_count, rounds),
                                              prompts=[r["prompt"] for r in rows], extras=columns)
            with timer("reward"):
                ids = [row[: int(n)].tolist() for row, n in zip(batch.completion_ids, batch.lengths)]
                scores = score_rewards(self.reward_fns, self.reward_weights, batch.prompts, batch.completions, ids,
                                       batch.extras)
            total, per_fn = scores.total, scores.per_fn
            rounds += 1
            if c.dynamic_sampling:
                informative = (~constant_groups(total, c.group_size)).nonzero().squeeze(-1)  # group ids
                if len(informative) == 0 and (kept or rounds < c.dynamic_sampling_max_rounds):
                    continue
                if len(informative):
                    batch, total, per_fn = _select(batch, total, per_fn, informative[: c.prompts_per_step - have])
            kept.append((batch, total, per_fn))
            have += batch.num_prompts
        batch = RolloutBatch.cat([b for b, _, _ in kept])
        total = torch.cat([t for _, t, _ in kept])
        per_fn = {k: torch.cat([f[k] for _, _, f in kept]) for k in kept[0][2]}
        return batch, total, per_fn, rounds

    # -- log-probs --------------------------------------------------------------------------------
    def logprobs(self, model: torch.nn.Module, batch: RolloutBatch, rows: torch.Tensor | None = None,
                 with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None] | torch.Tensor:
        """Per-token log-probs ``[B,T]`` of the batch's completions under ``model``. Without grad
        (old policy, reference) they are computed micro-batch by micro-batch."""
        c = self.config
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=c.dtype == "bf16")
        temperature = c.temperature if c.temperature > 0 else 1.0
        if rows is not None:
            with autocast:
                return token_logprobs(model, batch.prompt_ids[rows], batch.prompt_mask[rows],
                                      batch.completion_ids[rows], batch.completion_mask[rows], temperature=temperature,
                                      chunk_size=c.logprob_chunk_size, with_entropy=with_entropy, packed=c.packing)
        out = []
        with torch.no_grad(), autocast:
            for chunk in torch.arange(batch.batch_size).split(c.micro_batch_size):
                out.append(token_logprobs(model, batch.prompt_ids[chunk], batch.prompt_mask[chunk],
                                          batch.completion_ids[chunk], batch.completion_mask[chunk],
                                          temperature=temperature, chunk_size=c.logprob_chunk_size,
                                          packed=c.packing)[0])
        return torch.cat(out).float()

    def reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        with reference_context(self.policy, self.reference) as ref:
            return self.logprobs(ref, batch)

    # -- the update -------------------------------------------------------------------------------
    def update(self, batch: RolloutBatch, advantages: torch.Tensor, old_logp: torch.Tensor | None,
               ref_logp: torch.Tensor | None, mask: torch.Tensor,
               extras: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
        """mu passes over the rollout in shuffled minibatches of whole groups; each minibatch is one
        optimizer step, accumulated over micro-batches whose losses share the minibatch's denominators.
        ``extras`` are further per-row tensors ``[B, ...]`` that a subclass's :meth:`micro_loss` reads."""
        c, g = self.config, self.config.group_size
        avg = MetricAverager()
        self.policy.train()
        inputs = {"advantages": advantages, "old_logp": old_logp, "ref_logp": ref_logp, "mask": mask, **(extras or {})}
        for epoch in range(c.mu):
            shuffle = torch.Generator().manual_seed(_mix(c.seed, self.step_count, 1000 + epoch))
            groups = torch.randperm(batch.num_prompts, generator=shuffle)
            for mb in groups.split(self.minibatch_groups()):
                rows = (mb.unsqueeze(-1) * g + torch.arange(g)).view(-1)  # whole groups -> row ids
                n_rows, n_tokens = self.loss_denominators(mask[rows])
                self.optimizer.zero_grad(set_to_none=True)
                if n_tokens == 0:  # every row masked out: a step would only apply momentum
                    avg.add({"optim/skipped": torch.tensor(1.0)}, 1.0)
                    continue
                for micro in rows.split(c.micro_batch_size):
                    loss, m = self.micro_loss(batch, micro, inputs, n_rows, n_tokens)
                    loss.backward()
                    avg.add(m, float(mask[micro].sum()))
                norm = self.optimizer_step()
                avg.sums["optim/grad_norm"] = avg.sums.get("optim/grad_norm", 0.0) + norm
                avg.weights["optim/grad_norm"] = 1.0
                avg.optimizer_steps += 1
        self.policy.eval()
        out = avg.result()
        out["optim/lr"] = self.scheduler.get_last_lr()[0]
        return out

    def micro_loss(self, batch: RolloutBatch, micro: torch.Tensor, inputs: dict[str, torch.Tensor | None],
                   n_rows: float, n_tokens: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """GRPO's loss on rows ``micro`` of a minibatch of ``n_rows`` rows and ``n_tokens`` tokens
        (the shared denominators); ``inputs`` holds the per-row tensors passed to :meth:`update`."""
        c = self.config
        old_logp, ref_logp = inputs["old_logp"], inputs["ref_logp"]
        logp, entropy = self.logprobs(self.policy, batch, micro, with_entropy=True)
        return grpo_loss(
            logp, None if old_logp is None else old_logp[micro], None if ref_logp is None else ref_logp[micro],
            inputs["advantages"][micro], inputs["mask"][micro], eps_low=c.eps_low, eps_high=c.eps_high,
            beta=self.loss_beta(), kl_estimator=c.kl_estimator, aggregation=c.aggregation, level=c.importance_level,
            dual_clip=c.dual_clip, entropy=entropy, entropy_coef=c.entropy_coef, max_tokens=c.max_new_tokens,
            group_size=c.group_size, num_rows=n_rows, num_tokens=n_tokens)

    def loss_beta(self) -> float:
        """Coefficient of the KL term of the loss (0 when the KL is a reward penalty instead)."""
        return 0.0 if self.config.kl_in_reward else self.config.beta

    def optimizer_step(self) -> float:
        """Clip the gradient norm, step the optimizer and the schedule; returns the norm before clipping."""
        c = self.config
        params = [p for p in self.policy.parameters() if p.requires_grad]
        norm = torch.nn.utils.clip_grad_norm_(params, c.max_grad_norm if c.max_grad_norm > 0 else float("inf"))
        self.optimizer.step()
        self.scheduler.step()
        return float(norm)

    def sync_reference(self) -> None:
        """ref <- alpha * policy + (1 - alpha) * ref (TR-DPO style soft update; alpha = 1 copies)."""
        a = self.config.ref_sync_alpha
        with torch.no_grad():
            for r, p in zip(self.reference.parameters(), self.policy.parameters()):
                r.mul_(1 - a).add_(p.detach().to(r.dtype), alpha=a)

    # -- metrics ----------------------------------------------------------------------------------
    def reward_metrics(self, rewards: torch.Tensor, per_fn: dict[str, torch.Tensor],
                       constant: torch.Tensor) -> dict[str, float]:
        valid = rewards[~torch.isnan(rewards)]
        out = {"reward/mean": float(valid.mean()) if len(valid) else float("nan"),
               "reward/std": float(valid.std(unbiased=False)) if len(valid) else float("nan"),
               "rollout/zero_std_frac": float(constant.float().mean())}
        for name, values in per_fn.items():
            out[f"reward/{name}"] = float(values.nanmean())
        return out

    def rollout_metrics(self, batch: RolloutBatch, rounds: int) -> dict[str, float]:
        lengths = batch.lengths.float()
        return {"rollout/len_mean": float(lengths.mean()), "rollout/len_max": float(lengths.max()),
                "rollout/truncated_frac": float(batch.truncated.float().mean()), "rollout/rounds": float(rounds),
                "rollout/groups": float(batch.num_prompts)}

    def sample_records(self, batch: RolloutBatch, rewards: torch.Tensor, per_fn: dict[str, torch.Tensor],
                       advantages: torch.Tensor) -> list[dict[str, Any]]:
        def num(x: torch.Tensor) -> float | None:
            return None if torch.isnan(x) else float(x)

        return [{"prompt": batch.prompts[i] if isinstance(batch.prompts[i], str) else str(batch.prompts[i]),
                 "completion": batch.completions[i], "reward": num(rewards[i]),
                 "rewards": {k: num(v[i]) for k, v in per_fn.items()}, "advantage": float(advantages[i])}
                for i in range(batch.batch_size)]


def _constant_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[B]`` bool: rows of groups whose rewards carry no signal (see ``algos.constant_groups``)."""
    return constant_groups(rewards, group_size).repeat_interleave(group_size)


def _select(batch: RolloutBatch, total: torch.Tensor, per_fn: dict[str, torch.Tensor],
            groups: torch.Tensor) -> tuple[RolloutBatch, torch.Tensor, dict[str, torch.Tensor]]:
    g = batch.group_size
    rows = (groups.unsqueeze(-1) * g + torch.arange(g)).view(-1)
    return batch.select_groups(groups), total[rows], {k: v[rows] for k, v in per_fn.items()}


def _mix(*parts: int) -> int:
    """A deterministic seed from integers (per step, round, epoch), so a resumed run draws the same."""
    out = 0
    for p in parts:
        out = (out * 1_000_003 + int(p)) % (2**62)
    return out
