"""The settings ``benchmarks/learning.py`` trains both frameworks with: ``grouprl demo``'s config
(:func:`demo_config`) and its translation into TRL's ``GRPOConfig`` (:func:`trl_config`), which refuses any
setting TRL has no counterpart for."""

from __future__ import annotations


def demo_config(seed: int, threads: int, output_dir: str, **overrides):
    """The config ``grouprl demo`` trains with, for this seed and thread count, in fp32, logging nothing."""
    from grouprl.cli.demo import DEMO
    from grouprl.config import TrainConfig, from_dict

    return from_dict(TrainConfig, {**DEMO, "seed": seed, "num_threads": threads, "dtype": "fp32", "ref_dtype": "fp32",
                                   "output_dir": output_dir, "progress": False,
                                   "log_completions_every": 0, "print_completions": 0, **overrides})


def trl_config(c, seed: int, output_dir: str, gradient_checkpointing: bool):
    """TRL's ``GRPOConfig`` with the values of grouprl's config ``c``; a setting with no TRL counterpart fails."""
    from trl import GRPOConfig

    expected = {"algo": "grpo", "aggregation": "seq-mean-token-mean", "kl_estimator": "k3", "lr_schedule": "constant",
                "warmup_steps": 0, "importance_level": "token", "dynamic_sampling": False,
                "entropy_coef": 0.0, "kl_controller": None, "kl_in_reward": None, "advantage": None,
                "advantage_scale": None, "dual_clip": None, "min_p": 0.0, "lora_rank": 0, "ref_sync_steps": 0}
    wrong = {k: getattr(c, k) for k, v in expected.items() if getattr(c, k) != v}
    if wrong:
        raise ValueError(f"the demo's settings changed to ones this benchmark does not translate for TRL: {wrong}")
    prompts = c.prompts_per_step
    return GRPOConfig(
        output_dir=output_dir, per_device_train_batch_size=prompts * c.group_size, gradient_accumulation_steps=1,
        num_generations=c.group_size, max_completion_length=c.max_new_tokens, temperature=c.temperature,
        top_p=c.top_p, top_k=c.top_k, repetition_penalty=c.repetition_penalty, beta=c.beta, num_iterations=c.mu,
        epsilon=c.eps_low, epsilon_high=c.eps_high if c.eps_high is not None else c.eps_low,
        learning_rate=c.lr, lr_scheduler_type="constant", warmup_steps=0, adam_beta1=c.adam_beta1,
        adam_beta2=c.adam_beta2, weight_decay=c.weight_decay, max_grad_norm=c.max_grad_norm, loss_type="grpo",
        scale_rewards="group", mask_truncated_completions=c.mask_truncated, use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=gradient_checkpointing, report_to=[], logging_steps=1, save_strategy="no",
        max_steps=10_000, disable_tqdm=True, seed=seed, data_seed=seed, dataloader_num_workers=0,
        log_completions=False)
