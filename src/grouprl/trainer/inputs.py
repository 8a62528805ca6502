"""What a trainer trains on besides the model, checked once: prompt rows (or, for an agent, the rows
its environments reset from), reward functions and their weights, the held-out accuracy checker, the
environment and its tools. Building it fails, before any model is loaded, on an empty set, a row
without a prompt (when there is no environment), weights that do not line up, or a reward function
that needs a column the rows lack."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grouprl.data import check_rows
from grouprl.rewards.base import check_reward_columns

Row = dict[str, Any]
AGENT_COLUMNS = ("trajectory",)
"""What reward functions may ask for beyond the rows' columns in an agent run: the whole
conversation (messages with their roles)."""


@dataclass
class RunInputs:
    """Everything a trainer needs besides the model; checked on construction."""

    train_rows: list[Row]
    """Training rows: a ``prompt`` (text or chat messages) and any columns the reward functions read."""
    reward_fns: list[Callable[..., Any]]
    """Reward functions ``(prompts, completions, *, completion_ids, **columns) -> list[float | None]``."""
    eval_rows: list[Row] = field(default_factory=list)
    """Held-out rows (empty: no evaluation)."""
    reward_weights: list[float] | None = None
    """One weight per reward function (empty: 1 each)."""
    is_correct: Callable[[str, Row], bool] | None = None
    """``(completion, row) -> bool`` for held-out accuracy (a task's checker)."""
    system_prompt: str | None = None
    """The task's system prompt (the config's ``system_prompt``, when set, wins inside the trainer)."""
    env: Callable[[], Any] | None = None
    """A factory of text environments (:mod:`grouprl.envs`): each training row is a reset (its
    ``seed`` column, else its index, seeds it; the row itself is the reset's ``options``), and a
    trajectory's reward is its environment's return plus the weighted reward functions, if any."""
    tools: list[Any] = field(default_factory=list)
    """Tools the policy may call (:class:`grouprl.envs.tools.Tool`)."""
    judge: Any = None
    """A group judge (:mod:`grouprl.rewards.judges`) scoring each group side by side; None: no judge."""
    judge_weight: float | None = None
    """None: the judge's score is the reward; w: reward = reward functions + w * judge score."""
    train_places: list[str] = field(default_factory=list)
    """Where each training row comes from (``"prompts.jsonl line 7"``), for error messages; empty: rows
    given in code, named by their index."""
    eval_places: list[str] = field(default_factory=list)
    """The same for the held-out rows."""

    def __post_init__(self) -> None:
        self.train_rows, self.eval_rows, self.reward_fns = list(self.train_rows), list(self.eval_rows), \
            list(self.reward_fns)
        weights = [1.0] * len(self.reward_fns) if self.reward_weights is None else list(self.reward_weights)
        if len(weights) != len(self.reward_fns) or not (self.reward_fns or self.env is not None or self.judge):
            raise ValueError(f"{len(weights)} reward weights for {len(self.reward_fns)} reward functions (at least "
                             "one function, an environment or a judge is needed)")
        self.reward_weights = weights
        check_rows(self.train_rows, "train", needs_prompt=self.env is None)
        if self.eval_rows:
            check_rows(self.eval_rows, "eval", needs_prompt=self.env is None)
        agent_columns = list(AGENT_COLUMNS) if self.env is not None else []  # only an agent's rows carry them
        check_reward_columns(self.reward_fns, [k for k in self.train_rows[0] if k != "prompt"] + agent_columns)
