"""The trainer's keys of the objective: the KL term and its controller, the policy-gradient term and its
variants, the group advantage, the loss aggregation, what drops out of the loss, the reference's sync,
ppo's critic and GAE, trpo's trust region (``--help`` sections: algorithm, policy losses, ppo, trpo). A part of
:class:`~grouprl.trainer.config.TrainerConfig`, documented here once."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ObjectiveKeys:
    """What the update optimises (part of TrainerConfig)."""

    beta: float = 0.04
    """KL coefficient to the reference policy (DeepSeekMath 0.04). TRL now defaults to 0.0 and
    DAPO drops the term; 0 also skips the reference model entirely (less memory, no ref forward)."""
    kl_estimator: str = "k3"
    """KL estimator: k1 (log-ratio, unbiased, can be negative), k2 (squared log-ratio / 2) or k3
    (DeepSeekMath's unbiased non-negative estimator)."""
    kl_in_reward: bool | None = None
    """Apply the KL as a reward penalty before the advantage instead of as a loss term: per sequence
    (r - beta * sum_t KL_t) for the group estimators, per token (-beta * KL_t on every token, the
    outcome on the last) for ppo. Empty = the algorithm's own: true for ppo (PPO-RLHF's placement)
    when beta > 0, false otherwise."""
    kl_controller: str | None = None
    """fixed: beta stays at its initial value. adaptive: Ziegler et al.'s proportional controller
    moves beta so that the per-sequence KL tracks kl_target. Empty = the algorithm's own: adaptive
    for ppo, fixed otherwise."""
    kl_target: float = 6.0
    """Target per-sequence KL (sum over tokens) of the adaptive controller (Ziegler et al. 6.0)."""
    kl_horizon: int = 10000
    """Horizon of the adaptive controller, in rows: beta changes by at most 20% per horizon."""
    policy_loss: str = "clip"
    """The policy-gradient term (docs/policy-losses.md; grouprl.algos.policy_losses). clip: PPO/GRPO's clipped
    surrogate -min(rho*A, clip(rho)*A), the paper's and TRL's and verl's default. cispo (MiniMax-M1): the
    REINFORCE gradient weighted by the clipped, stop-gradient ratio, so clipped tokens still learn (TRL
    loss_type cispo, verl cispo). sapo (Qwen's SAPO): a smooth sigmoid gate on the ratio instead of a hard clip
    (TRL sapo, verl sapo). gmpo (GMPO): the geometric mean of the clipped token ratios, one per completion
    (verl geo_mean). Each reads only its own keys below; another's key is refused. On-policy (mu 1, one
    minibatch) rho = 1 and all four take the same step, REINFORCE's under the run's aggregation; they differ
    once the update is off-policy (mu > 1 or several minibatches)."""
    eps_low: float = 0.2
    """clip: lower clip range of the ratio: rho >= 1 - eps_low (PPO/GRPO 0.2)."""
    eps_high: float | None = None
    """clip: upper clip range: rho <= 1 + eps_high. Empty = eps_low. DAPO's clip-higher uses 0.28."""
    dual_clip: float | None = None
    """clip: dual-clip constant c > 1: bounds the loss of negative-advantage tokens at c*|A| (e.g. 3)."""
    importance_level: str = "token"
    """clip: importance ratio per token (GRPO/PPO) or per sequence (sequence = GSPO's length-normalised
    sequence ratio, more stable for long completions and MoE models)."""
    cispo_eps_low: float | None = None
    """cispo: the importance weight is at least 1 - cispo_eps_low. Empty = no lower bound (MiniMax-M1's
    choice; TRL's cispo has none either; verl's reuses its clip ratio, 0.2)."""
    cispo_eps_high: float = 4.0
    """cispo: the importance weight is at most 1 + cispo_eps_high. 4 caps it at 5, TRL's recommended
    epsilon_high=5.0 for cispo (its ScaleRL recipe, where epsilon_high is the cap itself); verl reuses its clip
    ratio (0.28 with clip-higher), a much tighter band. MiniMax-M1 tuned only this bound."""
    sapo_tau_pos: float = 1.0
    """sapo: gate temperature for positive advantages, f(rho) = sigmoid(tau (rho - 1)) * 4 / tau; larger =
    off-policy tokens damped sooner (SAPO paper, TRL and verl: 1.0)."""
    sapo_tau_neg: float = 1.05
    """sapo: gate temperature for zero and negative advantages (paper, TRL, verl: 1.05, above sapo_tau_pos:
    negative updates spread mass over the vocabulary and destabilise sooner)."""
    gmpo_eps_low: float = 0.4
    """gmpo: each token's log-ratio is clipped at -gmpo_eps_low on the pessimistic side (GMPO paper: 0.4, a
    ratio range of e^-0.4..e^0.4, wider than GRPO's because a geometric mean is less moved by one token;
    verl's geo_mean reads its clip ratios, set to 0.4 in its GMPO recipe)."""
    gmpo_eps_high: float | None = None
    """gmpo: the upper log-space clip, log rho <= gmpo_eps_high. Empty = gmpo_eps_low."""
    top_entropy_quantile: float = 1.0
    """Only the tokens in the top q share of the policy's entropy, over the minibatch's policy tokens, carry
    the policy-gradient term (Wang et al. 2025, "Beyond the 80/20 rule": q = 0.2 matched or beat full
    updates on Qwen3); KL, entropy bonus and denominators still count every token. 1 = every token (TRL's
    top_entropy_quantile default; verl has no such key). Below 1 it costs one more forward pass (no
    gradient) per minibatch: the quantile is over the whole minibatch, as the paper's batch, where TRL takes
    it per micro-batch."""
    advantage: str | None = None
    """Advantage estimator within each group (every algorithm but ppo, whose baseline is its critic):
    grpo (group mean baseline, scaled by advantage_scale), rloo (leave-one-out baseline), reinforce
    (group-mean baseline), rank (the centred rank within the group: only the order of rewards counts),
    or gigpo (agents: each turn gets A_episode + w * A_step, A_step comparing the turns of the reset's
    trajectories that start in the same state; GiGPO, arXiv 2505.10978). Empty = the algorithm's own
    (grpo for grpo and trpo); rloo and reinforce are defined by theirs."""
    advantage_scale: str | None = None
    """Divide centred rewards by the group std (group; the paper's population std), the group's sample
    std (group-sample; TRL and verl), the batch std (batch), or not at all (none; Dr. GRPO argues the
    group std over-weights near-solved prompts). Empty = the
    estimator's own: group for grpo, none for rloo and reinforce."""
    advantage_eps: float = 0.0
    """Added to the std before dividing (TRL: 1e-4). All-equal groups get 0 regardless."""
    aggregation: str = "seq-mean-token-mean"
    """Loss aggregation: seq-mean-token-mean (the paper), token-mean (DAPO; verl's default and
    TRL's 'dapo' default), seq-mean-token-sum-norm (Dr. GRPO, divides by max_new_tokens),
    group-sum, group-sqrt. See grouprl.algos.aggregate."""
    mask_truncated: bool = False
    """Leave completions that hit max_new_tokens out of the loss (DAPO's overlong filtering):
    their reward says more about the length limit than about the answer."""
    zero_std_groups: str = "drop"
    """Groups whose rewards are all equal have advantage 0, so no policy gradient. drop: they are
    left out of the loss altogether (no KL pull, denominators over informative groups only); keep:
    their tokens still carry the KL term and count in the loss denominators (the paper, TRL). drop
    is the default because keep lets the KL to the reference take over the update as a task
    saturates (docs/defaults.md)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop all-equal groups and sample more prompts until P informative
    groups are collected (at most dynamic_sampling_max_rounds rounds; then train on what there is)."""
    dynamic_sampling_max_rounds: int = 4
    """Most rollout rounds per step under dynamic sampling (the first included)."""
    entropy_coef: float = 0.0
    """Entropy bonus c_H: subtracts c_H * H(pi) from the loss to keep exploration (0 in GRPO)."""
    ref_sync_steps: int = 0
    """Every this many steps move the reference towards the policy (0 = frozen reference).
    Lets long runs leave the starting policy behind (TR-DPO / TRL's sync_ref_model)."""
    ref_sync_alpha: float = 1.0
    """Mixing on reference sync: ref = alpha * policy + (1 - alpha) * ref (1 = copy)."""
    # --- ppo: the critic and GAE ----------------------------------------------------------------
    gamma: float = 1.0
    """ppo: discount over completion tokens (1: the outcome reward is not discounted; TRL and verl)."""
    gae_lambda: float = 0.95
    """ppo: GAE lambda (TRL 0.95; verl 1.0)."""
    whiten_advantages: bool = True
    """ppo: whiten advantages over the batch's valid tokens (TRL, verl)."""
    vf_coef: float = 0.1
    """ppo: value-loss coefficient c_v in loss = pg + c_v * vf - c_H * H (TRL 0.1)."""
    vf_clip: float | None = 0.2
    """ppo: clip the change of each value prediction per update to this (TRL cliprange_value 0.2);
    empty = plain squared error."""
    critic_model: str = "copy"
    """ppo: copy: a value head on a copy of the policy's decoder (double the model memory). Otherwise a
    model to load (a bundled name or folder, same tokenizer) whose decoder carries the value head:
    a smaller critic costs less memory and compute."""
    critic_lr: float | None = None
    """ppo: AdamW learning rate of the critic; empty = lr. verl uses 10x the policy's."""
    critic_warmup_steps: int = 0
    """ppo: steps at the start that train only the critic (the policy is not updated), so the first
    policy updates see a baseline that has already fitted the returns."""
    # --- trpo: the trust region ------------------------------------------------------------------
    max_kl: float = 0.01
    """trpo: trust-region radius delta, the mean over completion tokens of KL(pi_old || pi_new)."""
    damping: float = 0.1
    """trpo: added to the Fisher matrix, (F + damping I): keeps conjugate gradient stable where F is
    near-singular (it always is for a language model: far more parameters than samples)."""
    cg_iters: int = 10
    """trpo: conjugate-gradient iterations, each one Fisher-vector product (one extra backward pass)."""
    backtracks: int = 10
    """trpo: line-search halvings of the step before the update is skipped."""
    accept_ratio: float = 0.1
    """trpo: a step is accepted if its improvement is at least this fraction of the linear prediction."""
    fisher_stride: int = 1
    """trpo: use every k-th row of the rollout for the Fisher-vector products: k times less memory and
    Fisher compute for a noisier curvature estimate (OpenAI baselines' TRPO used k = 5)."""
