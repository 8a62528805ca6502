"""Configuration of a classic-control run (``grouprl rl``): task, budget, run folder, and one section of knobs per
algorithm (``--ppo.eps_low 0.2``), each docstring its ``--help``. Knobs shared with ``grouprl train`` carry its
names (earlier names are accepted with a warning); defaults solve CartPole-v1 (docs/algorithms.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym

from grouprl.algos import ADVANTAGES, AGGREGATIONS, SCALES
from grouprl.control.algorithm_registry import ALGORITHMS
from grouprl.control.critic_fit import CRITIC_ADVANTAGES
from grouprl.control.policies import ACTIVATIONS
from grouprl.registry import Registry
from grouprl.run.loggers import logger_problems


def _rows_per_minibatch(batch_keys: tuple[str, ...]) -> Any:
    """Converter of the old ``minibatches`` count to ``minibatch_size`` rows (the product of ``batch_keys``)."""
    def convert(count: int, section: dict[str, Any]) -> int:
        rows = math.prod(int(section[k]) for k in batch_keys)
        return max(1, rows // max(1, int(count)))

    return convert


@dataclass
class GRPOControlConfig:
    """GRPO: a group is G episodes from the same reset seed; advantage = group-normalised return."""

    RENAMED: ClassVar[dict[str, Any]] = {
        "groups_per_step": "prompts_per_step",
        "minibatches": ("minibatch_size", _rows_per_minibatch(("prompts_per_step", "group_size"))),
    }

    prompts_per_step: int = 4
    """P: reset seeds per iteration (the 'prompts' of a language model)."""
    group_size: int = 8
    """G: episodes per reset seed (>= 2). The baseline of an episode is its group's mean return."""
    lr: float = 3e-3
    """Adam learning rate."""
    mu: int = 2
    """Passes over each batch of episodes (the paper's mu); > 1 makes the clipped ratio matter."""
    minibatch_size: int = 16
    """Episodes per optimizer step, whole groups (a multiple of G dividing P*G)."""
    eps_low: float = 0.2
    """Clip range of the probability ratio (1 - eps, 1 + eps)."""
    beta: float = 0.0
    """KL coefficient to the initial policy (k3). 0 as in DAPO: an exact reward has no reward model to
    over-optimise."""
    advantage: str = "grpo"
    """Advantage estimator over the group: grpo, rloo, reinforce, or gigpo (each step adds gigpo_step_weight
    times its discounted return compared with the group's steps from the same rounded state)."""
    advantage_scale: str = "group"
    """Divide by the group std (group), the batch std (batch) or nothing (none); gigpo: group or none."""
    gigpo_step_weight: float = 1.0
    """advantage=gigpo: w in A = A_episode + w * A_step (GiGPO: 1)."""
    gigpo_gamma: float = 0.95
    """advantage=gigpo: discount of the step returns compared within a state's group (GiGPO: 0.95)."""
    state_key_decimals: int = 1
    """advantage=gigpo: observations rounded to this many decimals are one state (coarser: larger groups of
    less alike states)."""
    aggregation: str = "token-mean"
    """Loss aggregation over steps: token-mean weighs every step alike (seq-mean-token-mean would give a
    long, good episode less weight per step)."""
    entropy_coef: float = 0.0
    """Entropy bonus c_H."""
    max_grad_norm: float = 0.5
    """Clip the gradient norm to this (0 = off)."""


@dataclass
class PPOControlConfig:
    """PPO (Schulman et al. 2017) with GAE, a clipped value loss and an entropy bonus."""

    RENAMED: ClassVar[dict[str, Any]] = {
        "epochs": "mu", "clip": "eps_low", "normalize_advantages": "whiten_advantages",
        "minibatches": ("minibatch_size", _rows_per_minibatch(("num_envs", "steps_per_env"))),
    }

    num_envs: int = 8
    """Environments stepped together."""
    steps_per_env: int = 128
    """Steps per environment per iteration (CleanRL: 4 envs x 128)."""
    lr: float = 1e-3
    """Adam learning rate of policy and critic (one optimizer, loss = pg + c_v * vf - c_H * H)."""
    mu: int = 4
    """Passes over each batch (CleanRL's update epochs K)."""
    minibatch_size: int = 256
    """Steps per optimizer step (the last minibatch of a pass takes what is left)."""
    eps_low: float = 0.2
    """Clip range epsilon of the ratio, (1 - eps, 1 + eps)."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    whiten_advantages: bool = True
    """Whiten advantages over the batch."""
    vf_coef: float = 0.5
    """Value-loss coefficient c_v."""
    vf_clip: float | None = None
    """Clip the value change per update (clipped value loss); empty = plain squared error, since on returns
    of ~100 a clip of 0.2 mostly slows the critic."""
    entropy_coef: float = 0.0
    """Entropy bonus c_H (CleanRL 0.01)."""
    max_grad_norm: float = 0.5
    """Clip the gradient norm to this (0 = off)."""
    target_kl: float | None = None
    """Stop the epochs of an iteration early once the approximate KL to the rollout policy exceeds this."""


@dataclass
class TRPOControlConfig:
    """TRPO (Schulman et al. 2015): natural-gradient step in a KL trust region, GAE, fitted critic."""

    num_envs: int = 8
    """Environments stepped together."""
    steps_per_env: int = 256
    """Steps per environment per iteration."""
    max_kl: float = 0.01
    """Trust-region radius delta: mean KL(pi_old || pi_new) over the batch states."""
    damping: float = 0.1
    """Added to the Fisher matrix (F + damping I) for a stable conjugate gradient."""
    cg_iters: int = 10
    """Conjugate-gradient iterations."""
    backtracks: int = 10
    """Line-search halvings before the step is skipped."""
    gae_lambda: float = 0.97
    """GAE lambda (Spinning Up's 0.97)."""
    lr: float = 1e-3
    """Adam learning rate of the critic (the policy takes natural-gradient steps, no optimizer)."""
    value_epochs: int = 5
    """Passes of critic regression per iteration."""
    value_minibatches: int = 4
    """Critic minibatches per pass."""


@dataclass
class VPGControlConfig:
    """Vanilla policy gradient (REINFORCE) with a learned state-value baseline."""

    RENAMED: ClassVar[dict[str, Any]] = {"normalize_advantages": "whiten_advantages"}

    num_envs: int = 8
    """Environments stepped together."""
    steps_per_env: int = 256
    """Steps per environment per iteration."""
    lr: float = 3e-3
    """Adam learning rate of policy and critic."""
    advantage: str = "gae"
    """Advantage estimate with the critic: mc (Monte Carlo return - V), nstep (A3C's n-step
    return - V) or gae (GAE(gamma, lambda))."""
    gae_lambda: float = 0.95
    """GAE lambda (advantage=gae)."""
    nstep: int = 5
    """n of the n-step return (advantage=nstep; A3C used 5)."""
    whiten_advantages: bool = True
    """Whiten advantages over the batch."""
    value_epochs: int = 5
    """Passes of critic regression per iteration, after the single policy step."""
    value_minibatches: int = 4
    """Critic minibatches per pass."""
    entropy_coef: float = 0.0
    """Entropy bonus c_H."""
    max_grad_norm: float = 0.5
    """Clip the gradient norm to this (0 = off)."""


@dataclass
class ControlConfig:
    env: str = "CartPole-v1"
    """gymnasium environment id (CartPole-v1, Acrobot-v1 and Pendulum-v1 are tested; any flat-Box
    observation space with Discrete or Box actions works)."""
    algo: str = "ppo"
    """Algorithm: grpo, ppo, trpo or vpg. Its knobs are the section of the same name."""
    seed: int = 0
    """Seed of the network init, action sampling and reset seeds."""
    total_env_steps: int = 200_000
    """Budget: stop after this many environment steps (evaluation episodes not counted)."""
    stop_at_return: float | None = None
    """Stop early once an evaluation's mean return reaches this (e.g. 475 = CartPole-v1 solved)."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the policy and the critic MLPs."""
    activation: str = "tanh"
    """Hidden activation: tanh or relu."""
    gamma: float = 0.99
    """Discount of the critic-based returns (GRPO uses the undiscounted episode return)."""
    reward_scale: float = 1.0
    """Multiply rewards by this before learning (metrics report raw returns); e.g. 0.01 on Pendulum,
    whose returns of about -1000 are hard for a critic to regress."""
    eval_every_env_steps: int = 10_000
    """Evaluate after the first iteration that passes each multiple of this (0 = only before/after)."""
    eval_episodes: int = 20
    """Evaluation episodes, from fixed held-out reset seeds."""
    eval_deterministic: bool = True
    """Evaluate the greedy policy (argmax / Gaussian mean), as stable-baselines3 does by default."""
    output_dir: str = "runs/rl"
    """Run folder: config.yaml, metrics.jsonl, checkpoints/, report/."""
    save_every: int = 0
    """Checkpoint every this many iterations (0 = only at the end)."""
    keep_checkpoints: int = 2
    """Keep only the newest this many checkpoints."""
    save_on_signal: bool = True
    """On SIGTERM or Ctrl-C, finish the iteration in progress and save a checkpoint of it if both end within
    25 s (before a scheduler's SIGKILL); a second signal stops at once. Off: stop without saving. The exit
    status is 128 + the signal's number."""
    resume_from: str | None = None
    """Resume from a checkpoint folder or 'latest' (weights, optimizer and budget; episodes restart)."""
    progress: bool = True
    """Show each iteration on the console: a live bar on a terminal, else one plain line per iteration."""
    tensorboard: bool = True
    """Also write TensorBoard event files when tensorboard is installed (loggers: [tensorboard] insists)."""
    loggers: tuple[str, ...] = ()
    """Where metrics go besides metrics.jsonl: tensorboard, trackio, wandb, as grouprl train's loggers
    (docs/logging.md); checked before anything is built."""
    num_threads: int = 1
    """torch intra-op threads. 1: these networks are tiny and extra threads only add overhead."""
    grpo: GRPOControlConfig = field(default_factory=GRPOControlConfig)
    ppo: PPOControlConfig = field(default_factory=PPOControlConfig)
    trpo: TRPOControlConfig = field(default_factory=TRPOControlConfig)
    vpg: VPGControlConfig = field(default_factory=VPGControlConfig)

    def __post_init__(self) -> None:
        for msg in _problems(self):
            raise ValueError(msg)

    @property
    def section(self) -> GRPOControlConfig | PPOControlConfig | TRPOControlConfig | VPGControlConfig:
        """The knobs of the chosen algorithm."""
        return getattr(self, self.algo)


def _name_problems(c: ControlConfig) -> list[str]:
    checks: list[tuple[str, str, Registry | tuple[str, ...]]] = [
        ("algo", c.algo, ALGORITHMS), ("activation", c.activation, ACTIVATIONS),
        ("grpo.advantage", c.grpo.advantage, ADVANTAGES),
        ("grpo.advantage_scale", c.grpo.advantage_scale, SCALES),
        ("grpo.aggregation", c.grpo.aggregation, AGGREGATIONS), ("vpg.advantage", c.vpg.advantage, CRITIC_ADVANTAGES),
    ]
    out = [f"{name}={value!r} is not one of: {', '.join(valid)}" for name, value, valid in checks if value not in valid]
    try:
        gym.spec(c.env)
    except gym.error.Error as e:
        out.append(f"env={c.env!r} is not a registered gymnasium environment ({e}); tested: CartPole-v1, "
                   "Acrobot-v1, Pendulum-v1")
    return out


def _problems(c: ControlConfig) -> list[str]:
    out = _name_problems(c) + logger_problems(c.loggers, c.tensorboard)
    if c.total_env_steps < 1 or c.eval_episodes < 1:
        out.append("total_env_steps and eval_episodes must be >= 1")
    if not c.hidden_sizes or min(c.hidden_sizes) < 1:
        out.append(f"hidden_sizes={c.hidden_sizes}: give at least one positive width")
    if not 0 < c.gamma <= 1:
        out.append(f"gamma={c.gamma} must be in (0, 1]")
    scales = ADVANTAGES.get(c.grpo.advantage).scales if c.grpo.advantage in ADVANTAGES else None
    if scales is not None and c.grpo.advantage_scale not in scales:
        out.append(f"grpo.advantage_scale={c.grpo.advantage_scale!r}: advantage={c.grpo.advantage} takes "
                   f"{' or '.join(scales)}")
    if not (0 <= c.grpo.gigpo_gamma <= 1 and c.grpo.gigpo_step_weight >= 0 and 0 <= c.grpo.state_key_decimals <= 8):
        out.append(f"grpo.gigpo_gamma={c.grpo.gigpo_gamma} must be in [0, 1], grpo.gigpo_step_weight="
                   f"{c.grpo.gigpo_step_weight} >= 0 and grpo.state_key_decimals={c.grpo.state_key_decimals} in 0..8")
    if c.grpo.group_size < 2:
        out.append(f"grpo.group_size={c.grpo.group_size}: a group compares episodes, set it >= 2")
    rows = c.grpo.prompts_per_step * c.grpo.group_size
    if c.grpo.minibatch_size < 1 or c.grpo.minibatch_size % c.grpo.group_size or rows % c.grpo.minibatch_size:
        out.append(f"grpo.minibatch_size={c.grpo.minibatch_size} must be a multiple of grpo.group_size="
                   f"{c.grpo.group_size} (whole groups) and divide prompts_per_step*group_size={rows}")
    if c.ppo.minibatch_size < 1:
        out.append(f"ppo.minibatch_size={c.ppo.minibatch_size} must be >= 1")
    for name in ("ppo", "trpo", "vpg"):
        s = getattr(c, name)
        if s.num_envs < 1 or s.steps_per_env < 1:
            out.append(f"{name}.num_envs and {name}.steps_per_env must be >= 1")
    if c.trpo.max_kl <= 0 or c.trpo.damping < 0:
        out.append("trpo.max_kl must be > 0 and trpo.damping >= 0")
    return out
