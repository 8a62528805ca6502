"""Reward functions: the protocol and scoring (:mod:`.base`), built-ins (:mod:`.builtin`), final
answers read and compared (:mod:`.answers`, math-verify bounded in :mod:`.symbolic`), a sandboxed
code-execution reward (:mod:`.code`) and learned reward models (:mod:`.reward_model`)."""

from grouprl.rewards.answers import (
    answer_is_correct,
    answers_correct,
    check_golds,
    completion_answer,
    gold_answer,
    same_answer,
    same_answers,
)
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
from grouprl.rewards.remote import RemoteJudge, RemoteReward  # also registers the http(s) judges
from grouprl.rewards.reward_model import RewardModel, train_reward_model
from grouprl.rewards.sandbox import Sandbox, SandboxLimits

__all__ = [
    "REWARDS", "CodeExecutionReward", "RemoteJudge", "RemoteReward", "RewardFn", "RewardFunctionError", "RewardModel",
    "RewardScores", "Sandbox",
    "SandboxLimits", "answer_is_correct", "answers_correct", "check_golds", "check_reward_columns", "combine",
    "completion_answer", "exact_match", "extract_answer", "format_reward", "gold_answer", "length_target",
    "make_reward", "math_equivalence", "overlong_penalty", "repetition_penalty", "reward_name", "same_answer",
    "same_answers", "score_rewards", "train_reward_model",
]
