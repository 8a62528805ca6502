"""Reward functions: the protocol and scoring (:mod:`.base`), built-ins (:mod:`.builtin`), a
sandboxed code-execution reward (:mod:`.code`) and learned reward models (:mod:`.reward_model`)."""

from grouprl.rewards.base import (
    RewardFn,
    RewardFunctionError,
    RewardScores,
    check_reward_columns,
    combine,
    reward_name,
    score_rewards,
)
from grouprl.rewards.builtin import (
    REWARDS,
    exact_match,
    extract_answer,
    format_reward,
    length_target,
    make_reward,
    math_equivalence,
    overlong_penalty,
    repetition_penalty,
)
from grouprl.rewards.code import CodeExecutionReward
from grouprl.rewards.reward_model import RewardModel, train_reward_model
from grouprl.rewards.sandbox import Sandbox, SandboxLimits

__all__ = [
    "REWARDS", "CodeExecutionReward", "RewardFn", "RewardFunctionError", "RewardModel", "RewardScores", "Sandbox",
    "SandboxLimits", "check_reward_columns", "combine", "exact_match", "extract_answer", "format_reward",
    "length_target", "make_reward", "math_equivalence", "overlong_penalty", "repetition_penalty", "reward_name",
    "score_rewards", "train_reward_model",
]
