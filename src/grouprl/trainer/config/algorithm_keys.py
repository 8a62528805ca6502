"""The trainer's keys of the update: the algorithm and its objective, the policy-loss variants, the optimizer, ppo's
critic and trpo's trust region."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AlgorithmKeys:
    SECTION = "algorithm"

    algo: str = "grpo"
    """Algorithm: grpo (group-relative advantages, clipped surrogate), rloo and reinforce (GRPO's update with a
    leave-one-out or group-mean baseline), ppo (a learned critic with GAE) or trpo (a natural-gradient step)."""
    total_steps: int = 100
    """Training steps (rollout + update) to run."""
    beta: float = 0.04
    """KL coefficient to the reference policy (DeepSeekMath: 0.04; TRL now defaults to 0, DAPO drops the term). 0
    also skips the reference model: less memory, no reference forward."""
    teacher_model: str | None = None
    """On-policy distillation's teacher (with distill_coef): a model as `model` takes, sharing the policy's
    tokenizer, or the http://host:port of a grouprl serve server of it (its token: rollout_server_token,
    GROUPRL_SERVER_TOKEN, or the one a server on this machine wrote). docs/distillation.md."""
    distill_coef: float = 0.0
    """On-policy distillation: each sampled token's advantage gets distill_coef x (log pi_teacher - log pi_policy), the
    per-token reverse KL to teacher_model with its gradient stopped; 1 with no reward functions distils alone, else
    it adds to the task's advantage. 0 = off."""
    advantage: str | None = None
    """Advantage estimator within each group (all but ppo, whose baseline is its critic): grpo (group mean baseline,
    scaled by advantage_scale), rloo (leave-one-out), reinforce (group mean), rank (centred rank in the group) or
    gigpo (agents: A_episode + w * A_step over turns from the same state; arXiv 2505.10978). Empty = the algorithm's."""
    advantage_scale: str | None = None
    """Divide centred rewards by the group's std (group: the paper's), its sample std (group-sample: TRL, verl), the
    batch std (batch) or nothing (none: Dr. GRPO). Empty = group for grpo, none for rloo and reinforce."""
    policy_loss: str = "clip"
    """The policy-gradient term (docs/policy-losses.md): clip (PPO/GRPO's clipped surrogate; the paper's, TRL's and
    verl's default), cispo (MiniMax-M1: the REINFORCE gradient weighted by the clipped, stop-gradient ratio), sapo
    (Qwen's SAPO: a smooth sigmoid gate) or gmpo (the geometric mean of the clipped token ratios per completion).
    Each reads only its own keys; on-policy (mu 1, one minibatch) all four take the same step."""
    aggregation: str = "seq-mean-token-mean"
    """Loss aggregation: seq-mean-token-mean (the paper), token-mean (DAPO; verl's default and TRL's 'dapo'),
    seq-mean-token-sum-norm (Dr. GRPO: divides by max_new_tokens), group-sum, group-sqrt."""
    zero_std_groups: str = "drop"
    """Groups whose rewards are all equal have advantage 0. drop: they leave the loss (no KL pull, no share of the
    denominators); keep: they still carry the KL term (the paper, TRL), which then takes over as a task saturates."""
    mu: int = 1
    """Passes of minibatch updates over each rollout (the paper's mu). 1 with one minibatch is on-policy: the ratio
    is exactly 1 and no old-policy forward is needed."""
    minibatch_size: int | None = None
    """Rows per optimizer step (a multiple of G). Empty = the whole rollout, one step per pass; smaller minibatches
    make the update off-policy after the first."""
    micro_batch_size: int = 8
    """Rows per forward/backward pass; a minibatch's micro-batches accumulate gradients before the optimizer step.
    Changes memory and speed, never the update."""
    eps_low: float = 0.2
    """clip: lower clip range of the ratio: rho >= 1 - eps_low (PPO/GRPO 0.2)."""
    eps_high: float | None = None
    """clip: upper clip range: rho <= 1 + eps_high. Empty = eps_low. DAPO's clip-higher uses 0.28."""
    dual_clip: float | None = None
    """clip: dual-clip constant c > 1: bounds the loss of negative-advantage tokens at c*|A| (e.g. 3)."""
    kl_estimator: str = "k3"
    """KL estimator: k1 (log-ratio, unbiased, can be negative), k2 (squared log-ratio / 2) or k3
    (DeepSeekMath's unbiased non-negative estimator)."""
    kl_in_reward: bool | None = None
    """Apply the KL as a reward penalty before the advantage instead of as a loss term: per sequence for group
    estimators, per token for ppo. Empty = true for ppo with beta > 0 (PPO-RLHF's placement), false otherwise."""
    kl_controller: str | None = None
    """fixed: beta stays as set; adaptive: Ziegler et al.'s proportional controller moves beta so the per-sequence KL
    tracks kl_target. Empty = adaptive for ppo, fixed otherwise."""
    kl_target: float = 6.0
    """Target per-sequence KL (sum over tokens) of the adaptive controller (Ziegler et al. 6.0)."""
    kl_horizon: int = 10000
    """Horizon of the adaptive controller, in rows: beta changes by at most 20% per horizon."""
    importance_level: str = "token"
    """clip: the importance ratio per token (GRPO/PPO) or per sequence (GSPO's length-normalised sequence ratio,
    steadier for long completions and MoE models)."""
    advantage_eps: float = 0.0
    """Added to the std before dividing (TRL: 1e-4). All-equal groups get 0 regardless."""
    mask_truncated: bool = False
    """Leave completions that hit max_new_tokens out of the loss (DAPO's overlong filtering): their reward says more
    about the length limit than the answer."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: drop all-equal groups and sample more prompts until P informative groups are in (at
    most dynamic_sampling_max_rounds rounds)."""
    dynamic_sampling_max_rounds: int = 4
    """Most rollout rounds per step under dynamic sampling (the first included)."""
    group_by: str | None = None
    """Group the rows that share this dataset column's value (several phrasings of one task, say) instead of each
    prompt's G completions; groups may then differ in size."""
    entropy_coef: float = 0.0
    """Entropy bonus c_H: subtracts c_H * H(pi) from the loss to keep exploration (0 in GRPO)."""
    top_entropy_quantile: float = 1.0
    """Only the top q share of policy tokens by entropy, over the minibatch, carry the policy-gradient term (Wang et
    al. 2025, "Beyond the 80/20 rule": q = 0.2); KL, entropy bonus and denominators count every token. 1 = all (TRL's
    default). Below 1 it costs one forward pass per minibatch."""
    ref_sync_steps: int = 0
    """Every this many steps move the reference towards the policy (0 = frozen reference), so long runs can leave the
    start behind (TR-DPO; TRL's sync_ref_model)."""
    ref_sync_alpha: float = 1.0
    """Mixing on reference sync: ref = alpha * policy + (1 - alpha) * ref (1 = copy)."""


@dataclass
class PolicyLossKeys:
    SECTION = "policy losses (policy_loss)"

    cispo_eps_high: float = 4.0
    """cispo: the importance weight is at most 1 + cispo_eps_high. 4 caps it at 5, as TRL recommends for cispo; verl
    reuses its clip ratio (0.28 with clip-higher), a much tighter band. MiniMax-M1 tuned only this bound."""
    cispo_eps_low: float | None = None
    """cispo: the importance weight is at least 1 - cispo_eps_low. Empty = no lower bound (MiniMax-M1, TRL; verl
    reuses its clip ratio, 0.2)."""
    sapo_tau_pos: float = 1.0
    """sapo: gate temperature for positive advantages, f(rho) = sigmoid(tau (rho - 1)) * 4 / tau; larger damps
    off-policy tokens sooner (SAPO, TRL, verl: 1.0)."""
    sapo_tau_neg: float = 1.05
    """sapo: gate temperature for zero and negative advantages (SAPO, TRL, verl: 1.05; negative updates spread mass
    over the vocabulary and destabilise sooner)."""
    gmpo_eps_low: float = 0.4
    """gmpo: each token's log-ratio is clipped at -gmpo_eps_low on the pessimistic side (GMPO: 0.4, wider than GRPO's
    range because one token moves a geometric mean less)."""
    gmpo_eps_high: float | None = None
    """gmpo: the upper log-space clip, log rho <= gmpo_eps_high. Empty = gmpo_eps_low."""


@dataclass
class OptimizerKeys:
    SECTION = "optimizer"

    lr: float = 1e-6
    """AdamW learning rate. 1e-6 as TRL's default and DeepSeekMath; LoRA typically wants 1e-5 to 1e-4."""
    lr_schedule: str = "constant"
    """Learning-rate schedule after warm-up: constant, linear (to 0) or cosine (to 0)."""
    warmup_steps: int = 0
    """Optimizer steps of linear warm-up from 0 to lr."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay (DeepSeekMath 0.1; TRL 0.0)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this before each optimizer step (0 = no clipping)."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.99
    """AdamW beta2 (0.99 as in DeepSeekMath's and TRL's GRPO examples; PyTorch's default is 0.999)."""


@dataclass
class CriticKeys:
    SECTION = "ppo (critic and GAE)"

    critic_model: str = "copy"
    """ppo: copy (a value head on a copy of the policy's decoder: twice the model memory), or a model to load with the
    same tokenizer (a bundled name or folder) whose decoder carries the value head: a smaller critic costs less."""
    critic_lr: float | None = None
    """ppo: AdamW learning rate of the critic; empty = lr (verl's examples give the critic ten times the policy's)."""
    vf_coef: float = 0.1
    """ppo: value-loss coefficient c_v in loss = pg + c_v * vf - c_H * H (TRL 0.1)."""
    vf_clip: float | None = 0.2
    """ppo: clip the change of each value prediction per update to this (TRL cliprange_value 0.2);
    empty = plain squared error."""
    gamma: float = 1.0
    """ppo: discount over completion tokens (1: the outcome reward is not discounted; TRL and verl)."""
    gae_lambda: float = 0.95
    """ppo: GAE lambda (TRL 0.95; verl 1.0)."""
    whiten_advantages: bool = True
    """ppo: whiten advantages over the batch's valid tokens (TRL, verl)."""
    critic_warmup_steps: int = 0
    """ppo: steps at the start that train only the critic, so the first policy updates see a baseline that already
    fits the returns."""


@dataclass
class TrustRegionKeys:
    SECTION = "trpo (trust region)"

    max_kl: float = 0.01
    """trpo: trust-region radius delta, the mean over completion tokens of KL(pi_old || pi_new)."""
    damping: float = 0.1
    """trpo: added to the Fisher matrix, F + damping I, keeping conjugate gradient stable where F is near-singular
    (always, for a language model)."""
    cg_iters: int = 10
    """trpo: conjugate-gradient iterations, each one Fisher-vector product (one extra backward pass)."""
    backtracks: int = 10
    """trpo: line-search halvings of the step before the update is skipped."""
    accept_ratio: float = 0.1
    """trpo: a step is accepted if its improvement is at least this fraction of the linear prediction."""
    fisher_stride: int = 1
    """trpo: Fisher-vector products on every k-th row: k times less memory and compute for a noisier curvature
    (OpenAI baselines' TRPO: 5)."""
