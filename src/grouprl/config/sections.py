"""Where each key of ``grouprl train`` stands in ``--help``: :data:`SECTIONS`, one map from field name to
section, whose order is the help's order (sections by their first key, keys within a section as
listed: the ones a newcomer sets first come first).

A field missing from the map still works and is listed, under :data:`OTHER` at the end; a test holds
every field of :class:`~grouprl.config.TrainConfig` to having a section.
"""

from __future__ import annotations

MODEL_AND_DATA = "model and data"
REWARDS = "rewards"
SAMPLING = "sampling"
ALGORITHM = "algorithm"
POLICY_LOSSES = "policy losses (policy_loss)"
OPTIMIZER = "optimizer"
PPO = "ppo (critic and GAE)"
TRPO = "trpo (trust region)"
AGENTS = "agents (environments and tools)"
LORA = "LoRA"
PRECISION = "precision and engines"
DISTRIBUTION = "distribution (several processes)"
EVALUATION = "evaluation"
RUN_FOLDER = "run folder (logs, checkpoints)"
OTHER = "other options"

SECTIONS: dict[str, str] = {
    # what to train, on what
    "model": MODEL_AND_DATA, "task": MODEL_AND_DATA, "dataset": MODEL_AND_DATA, "task_options": MODEL_AND_DATA,
    "prompt_column": MODEL_AND_DATA, "train_size": MODEL_AND_DATA, "eval_size": MODEL_AND_DATA,
    "eval_dataset": MODEL_AND_DATA, "eval_fraction": MODEL_AND_DATA, "dataset_config": MODEL_AND_DATA,
    "dataset_split": MODEL_AND_DATA, "eval_split": MODEL_AND_DATA, "answer_column": MODEL_AND_DATA,
    "system_prompt": MODEL_AND_DATA, "use_chat_template": MODEL_AND_DATA, "max_prompt_len": MODEL_AND_DATA,
    # for what reward
    "reward_functions": REWARDS, "reward_weights": REWARDS, "reward_options": REWARDS, "reward_model": REWARDS,
    "accuracy_fn": REWARDS, "judge": REWARDS, "judge_weight": REWARDS, "judge_options": REWARDS,
    # the rollout
    "group_size": SAMPLING, "prompts_per_step": SAMPLING, "max_new_tokens": SAMPLING, "temperature": SAMPLING,
    "top_p": SAMPLING, "top_k": SAMPLING, "min_p": SAMPLING, "repetition_penalty": SAMPLING,
    "stop_strings": SAMPLING, "rollout_mode": SAMPLING,
    # the update
    "algo": ALGORITHM, "total_steps": ALGORITHM, "beta": ALGORITHM, "advantage": ALGORITHM,
    "advantage_scale": ALGORITHM, "policy_loss": ALGORITHM, "aggregation": ALGORITHM, "zero_std_groups": ALGORITHM,
    "mu": ALGORITHM,
    "minibatch_size": ALGORITHM, "micro_batch_size": ALGORITHM, "eps_low": ALGORITHM, "eps_high": ALGORITHM,
    "dual_clip": ALGORITHM, "kl_estimator": ALGORITHM, "kl_in_reward": ALGORITHM, "kl_controller": ALGORITHM,
    "kl_target": ALGORITHM, "kl_horizon": ALGORITHM, "importance_level": ALGORITHM, "advantage_eps": ALGORITHM,
    "mask_truncated": ALGORITHM, "dynamic_sampling": ALGORITHM, "dynamic_sampling_max_rounds": ALGORITHM,
    "group_by": ALGORITHM, "entropy_coef": ALGORITHM, "top_entropy_quantile": ALGORITHM, "ref_sync_steps": ALGORITHM,
    "ref_sync_alpha": ALGORITHM,
    "cispo_eps_high": POLICY_LOSSES, "cispo_eps_low": POLICY_LOSSES, "sapo_tau_pos": POLICY_LOSSES,
    "sapo_tau_neg": POLICY_LOSSES, "gmpo_eps_low": POLICY_LOSSES, "gmpo_eps_high": POLICY_LOSSES,
    "lr": OPTIMIZER, "lr_schedule": OPTIMIZER, "warmup_steps": OPTIMIZER, "weight_decay": OPTIMIZER,
    "max_grad_norm": OPTIMIZER, "adam_beta1": OPTIMIZER, "adam_beta2": OPTIMIZER,
    "critic_model": PPO, "critic_lr": PPO, "vf_coef": PPO, "vf_clip": PPO, "gamma": PPO, "gae_lambda": PPO,
    "whiten_advantages": PPO, "critic_warmup_steps": PPO,
    "max_kl": TRPO, "damping": TRPO, "cg_iters": TRPO, "backtracks": TRPO, "accept_ratio": TRPO,
    "fisher_stride": TRPO,
    # agents
    "env": AGENTS, "env_options": AGENTS, "tools": AGENTS, "max_turns": AGENTS, "max_trajectory_tokens": AGENTS,
    "max_tool_calls": AGENTS, "tool_parser": AGENTS, "tool_timeout_s": AGENTS, "gigpo_step_weight": AGENTS,
    "gigpo_gamma": AGENTS, "gigpo_similarity": AGENTS,
    "lora_rank": LORA, "lora_alpha": LORA, "lora_dropout": LORA, "lora_target_modules": LORA,
    # how it runs
    "dtype": PRECISION, "rollout_engine": PRECISION, "rollout_dtype": PRECISION, "ref_dtype": PRECISION,
    "gradient_checkpointing": PRECISION, "rollout_compile": PRECISION, "packing": PRECISION,
    "rollout_is": PRECISION, "rollout_is_cap": PRECISION, "icepop_low": PRECISION, "icepop_high": PRECISION,
    "sequence_mask_low": PRECISION, "sequence_mask_high": PRECISION, "logprob_chunk_size": PRECISION,
    "vllm_gpu_memory_utilization": PRECISION, "vllm_sleep": PRECISION, "vllm_compile": PRECISION,
    "vllm_kv_cache_gib": PRECISION, "rollout_servers": PRECISION, "rollout_server_token": PRECISION,
    "rollout_server_timeout": PRECISION,
    "rollout_server_restarts": PRECISION,
    "rollout_weights_dir": PRECISION, "rollout_weights_transport": PRECISION, "max_staleness": PRECISION,
    "num_threads": PRECISION, "allocator": PRECISION,
    "engine": DISTRIBUTION, "mixed_precision": DISTRIBUTION, "cpu_offload": DISTRIBUTION,
    "eval_every": EVALUATION, "eval_samples": EVALUATION, "eval_temperature": EVALUATION,
    "output_dir": RUN_FOLDER, "resume_from": RUN_FOLDER, "save_every": RUN_FOLDER, "keep_checkpoints": RUN_FOLDER,
    "save_on_signal": RUN_FOLDER,
    "seed": RUN_FOLDER, "log_completions_every": RUN_FOLDER, "print_completions": RUN_FOLDER,
    "progress": RUN_FOLDER, "tensorboard": RUN_FOLDER, "loggers": RUN_FOLDER,
}
"""Field name -> its ``--help`` section, in help order (see the module docstring)."""

USUAL_KEYS: tuple[str, ...] = ("model", "task", "dataset", "reward_functions", "total_steps", "prompts_per_step",
                               "group_size", "max_new_tokens", "lr", "output_dir", "loggers", "resume_from")
"""The keys of a usual run, which the first screen of ``grouprl train --help`` shows one line each."""

SECTION_NOTES: dict[str, str] = {
    POLICY_LOSSES: "Each read only with the policy_loss its name starts with.",
    PPO: "Read only with --algo ppo; refused under another algorithm.",
    TRPO: "Read only with --algo trpo; refused under another algorithm.",
    AGENTS: "With env set, max_new_tokens is per turn.",
    DISTRIBUTION: "train --nproc N or torchrun; unused in one process on a CPU.",
}
"""A line under some section titles."""


def short_name(title: str) -> str:
    """A section's name on the command line (``grouprl train --help sampling``): its title's first word, in
    lower case; a test holds them distinct.

    >>> short_name(RUN_FOLDER)
    'run'
    """
    return title.split()[0].lower()


def section_order(names: list[str], sections: dict[str, str] = SECTIONS) -> list[tuple[str, list[str]]]:
    """``names`` (fields) grouped into [(section, fields)], both in the order of ``sections`` (a map like
    :data:`SECTIONS`); fields it does not place come last, under :data:`OTHER`, in the order given.

    >>> section_order(["lr", "new_key", "model", "task"])
    [('model and data', ['model', 'task']), ('optimizer', ['lr']), ('other options', ['new_key'])]
    """
    given = set(names)
    grouped: dict[str, list[str]] = {}
    for name, section in sections.items():
        if name in given:
            grouped.setdefault(section, []).append(name)
    rest = [n for n in names if n not in sections]
    if rest:
        grouped.setdefault(OTHER, []).extend(rest)
    return list(grouped.items())
