"""Shared pieces of the trainer tests: a tiny model, a learnable reward, a trainer factory, and the
trainer's parts driven one at a time (a rollout, an update on given advantages)."""

from __future__ import annotations

from dataclasses import replace

import torch

from grouprl.models import tiny_causal_lm
from grouprl.run.logs import PhaseTimer
from grouprl.trainer.config import TrainerConfig
from grouprl.trainer.trainer import Trainer
from grouprl.trainer.update import UpdateBatch
from grouprl.types import RolloutBatch

RESUME_SETTINGS = {"save_every": 1, "mu": 2, "minibatch_size": 4, "eval_every": 0}
"""Off-policy settings for the resume test: optimizer moments and old log-probs both matter."""

PROMPTS = [{"prompt": f"Count: {i}", "target": "7"} for i in range(16)]


def digit_share(prompts, completions, **_):
    """Share of characters of the completion that are digits (learnable by a tiny model)."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def base_config(tmp_path, **overrides) -> TrainerConfig:
    # fp32 whatever the CPU: the expected numbers of the tests must not depend on what dtype=auto measures
    cfg = TrainerConfig(prompts_per_step=2, group_size=4, max_new_tokens=6, total_steps=2, lr=1e-3, beta=0.04,
                        dtype="fp32", micro_batch_size=8, output_dir=str(tmp_path / "run"), progress=False,
                        log_completions_every=1, print_completions=0, seed=3)
    return replace(cfg, **overrides)


def make_trainer(tmp_path, model_seed=0, reward_fns=(digit_share,), critic_backbone=None, **overrides) -> Trainer:
    torch.manual_seed(0)
    model, tok = tiny_causal_lm(seed=model_seed)
    return Trainer(base_config(tmp_path, **overrides), policy=model, tokenizer=tok, reward_fns=list(reward_fns),
                   train_data=PROMPTS, eval_data=PROMPTS[:4], critic_backbone=critic_backbone,
                   is_correct=lambda completion, row: row["target"] in completion)


def rollout(trainer: Trainer) -> tuple[RolloutBatch, torch.Tensor]:
    """One step's collected rollout and rewards, without training on them."""
    got = trainer.collector.collect(trainer.step_count, PhaseTimer())
    return got.batch, got.rewards


def run_update(trainer: Trainer, batch: RolloutBatch, advantages: torch.Tensor, old_logp=None, ref_logp=None,
               mask=None, **extras) -> dict[str, float]:
    """The trainer's update rule on ``batch`` with the given advantages (``[B]`` or ``[B, T]``)."""
    data = UpdateBatch(rollout=batch, advantages=advantages, mask=batch.completion_mask if mask is None else mask,
                       old_logp=old_logp, ref_logp=ref_logp, **extras)
    return trainer.rule.update(data, trainer.step_count, trainer.config.beta)


def update_grads(trainer: Trainer, batch: RolloutBatch, advantages: torch.Tensor, **kwargs) -> dict[str, torch.Tensor]:
    """:func:`run_update` (one optimizer step), returning the policy's gradients as that step took them
    (after clipping): the update frees them once it is done."""
    taken = []
    hook = trainer.rule.optimizer.register_step_pre_hook(lambda *_: taken.append(
        {k: p.grad.clone() for k, p in trainer.policy.named_parameters()}))
    try:
        run_update(trainer, batch, advantages, **kwargs)
    finally:
        hook.remove()
    assert len(taken) == 1, f"expected one optimizer step, got {len(taken)}"
    return taken[0]


def params_of(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def raises_on_every_batch(prompts, completions, **_):
    """A reward function that fails the first time it scores anything (a start that fails at its first step)."""
    raise RuntimeError("this reward function is broken")


def tiny_args(tmp_path, *extra: str) -> list[str]:
    """``grouprl train`` options for a 2-step run of the tiny model on the demo's task, into
    ``tmp_path/run``; ``extra`` options come last and win."""
    return ["--model", "tiny", "--reward_functions", "grouprl.cli.demo:digit_share", "--accuracy_fn",
            "grouprl.cli.demo:only_digits", "--prompts_per_step", "2", "--group_size", "4", "--max_new_tokens", "4",
            "--total_steps", "2", "--lr", "1e-3", "--eval_size", "5", "--eval_samples", "2", "--train_size", "16",
            "--log_completions_every", "1", "--no-progress", "--output_dir",
            str(tmp_path / "run"), *extra]
