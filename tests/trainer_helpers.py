"""Shared pieces of the trainer tests: a tiny model, a learnable reward, a trainer factory."""

from __future__ import annotations

from dataclasses import replace

import torch

from grouprl.models import tiny_causal_lm
from grouprl.trainer.config import GRPOConfig
from grouprl.trainer.grpo import GRPOTrainer

RESUME_SETTINGS = {"save_every": 1, "mu": 2, "minibatch_size": 4, "eval_every": 0}
"""Off-policy settings for the resume test: optimizer moments and old log-probs both matter."""

PROMPTS = [{"prompt": f"Count: {i}", "target": "7"} for i in range(16)]


def digit_share(prompts, completions, **_):
    """Share of characters of the completion that are digits (learnable by a tiny model)."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def base_config(tmp_path, **overrides) -> GRPOConfig:
    cfg = GRPOConfig(prompts_per_step=2, group_size=4, max_new_tokens=6, total_steps=2, lr=1e-3, beta=0.04,
                     micro_batch_size=8, output_dir=str(tmp_path / "run"), progress=False, tensorboard=False,
                     log_completions_every=1, print_completions=0, seed=3)
    return replace(cfg, **overrides)


def make_trainer(tmp_path, model_seed=0, reward_fns=(digit_share,), **overrides) -> GRPOTrainer:
    torch.manual_seed(0)
    model, tok = tiny_causal_lm(seed=model_seed)
    return GRPOTrainer(base_config(tmp_path, **overrides), policy=model, tokenizer=tok, reward_fns=list(reward_fns),
                       train_data=PROMPTS, eval_data=PROMPTS[:4],
                       is_correct=lambda completion, row: row["target"] in completion)


def params_of(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}
