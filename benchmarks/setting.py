"""The GRPO step the single-process benchmarks measure: ``benchmarks/vs_trl.py``'s setting (SmolLM2-135M-Instruct
on the arithmetic task, 4 prompts x G=4, at most 64 new tokens, temperature 1, lr 1e-6), grouprl's defaults
otherwise, with nothing written beyond a temporary run folder."""

from __future__ import annotations

import tempfile
from typing import Any


def step_trainer(policy: Any, tokenizer: Any, name: str, **settings: Any) -> Any:
    """A ``GRPOTrainer`` of ``policy`` in that setting; ``settings`` are further config fields (beta,
    rollout_engine, ...). ``name`` prefixes the temporary run folder."""
    from grouprl.tasks import get_task
    from grouprl.trainer.config import GRPOConfig
    from grouprl.trainer.trainer import GRPOTrainer

    task = get_task("arithmetic")
    config = GRPOConfig(prompts_per_step=4, group_size=4, max_new_tokens=64, temperature=1.0, lr=1e-6,
                        output_dir=tempfile.mkdtemp(prefix=f"{name}-"), progress=False,
                        log_completions_every=0, **settings)
    return GRPOTrainer(config, policy=policy, tokenizer=tokenizer, reward_fns=list(task.reward_fns),
                       train_data=task.rows("train", 400, seed=0), system_prompt=task.system_prompt)
