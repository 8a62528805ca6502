"""The trainer's keys that say which algorithm runs and the shape of its batches and optimizer steps:
``algo``, the batch shape (P, G, mu, minibatches, micro-batches, steps) and AdamW with its schedule
(``--help`` sections: algorithm, optimizer). A part of :class:`~grouprl.trainer.config.TrainerConfig`,
documented here once."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AlgorithmKeys:
    """Which algorithm, its batch shape and its optimizer (part of TrainerConfig)."""

    algo: str = "grpo"
    """Algorithm: grpo (group-relative advantages, clipped surrogate), rloo and reinforce (GRPO's update with a
    leave-one-out or group-mean baseline, no std division), ppo (a learned critic with GAE), trpo (a natural-gradient
    step in a KL trust region). ppo's and trpo's own keys have sections of their own."""
    # --- batch shape -------------------------------------------------------------------------
    prompts_per_step: int = 4
    """P: prompts sampled per training step. Each step generates P * G completions."""
    group_size: int = 8
    """G: completions per prompt (>= 2). A larger G lowers the variance of the group baseline (DeepSeekMath: 64,
    TRL's default: 8, verl's examples: 5-16)."""
    mu: int = 1
    """Passes of minibatch updates over each rollout (the paper's mu). 1 with one minibatch is on-policy: the ratio
    is exactly 1 and no old-policy forward is needed."""
    minibatch_size: int | None = None
    """Rows per optimizer step (a multiple of G). Empty = the whole rollout, one step per pass; smaller minibatches
    make the update off-policy after the first."""
    micro_batch_size: int = 8
    """Rows per forward/backward pass; a minibatch's micro-batches accumulate gradients before the optimizer step.
    Changes memory and speed, never the update."""
    total_steps: int = 100
    """Training steps (rollout + update) to run."""
    # --- optimisation (unused by trpo, whose step is a natural gradient) ----------------------
    lr: float = 1e-6
    """AdamW learning rate. 1e-6 as TRL's default and DeepSeekMath; LoRA typically wants 1e-5 to 1e-4."""
    lr_schedule: str = "constant"
    """Learning-rate schedule after warm-up: constant, linear (to 0) or cosine (to 0)."""
    warmup_steps: int = 0
    """Optimizer steps of linear warm-up from 0 to lr."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.99
    """AdamW beta2 (0.99 as in DeepSeekMath's and TRL's GRPO examples; PyTorch's default is 0.999)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay (DeepSeekMath 0.1; TRL 0.0)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this before each optimizer step (0 = no clipping)."""
