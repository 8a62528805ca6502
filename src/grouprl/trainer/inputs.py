"""What a trainer trains on besides the model, checked on construction, before any model is loaded."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from grouprl.data import check_rows
from grouprl.rewards.base import check_reward_columns

Row = dict[str, Any]
AGENT_COLUMNS = ("trajectory",)  # what an agent run's reward functions may ask beyond the rows' columns


@dataclass
class RunInputs:
    """What a trainer trains on besides the model; ``*_places`` say where each row comes from, for errors."""

    train_rows: list[Row]
    reward_fns: list[Callable[..., Any]]
    eval_rows: list[Row] = field(default_factory=list)
    reward_weights: list[float] | None = None
    is_correct: Callable[[str, Row], bool] | None = None
    system_prompt: str | None = None  # the task's; the config's system_prompt, when set, wins
    env: Callable[[], Any] | None = None
    agent: Callable[..., Any] | None = None
    tools: list[Any] = field(default_factory=list)
    judge: Any = None
    judge_weight: float | None = None
    train_places: list[str] = field(default_factory=list)
    eval_places: list[str] = field(default_factory=list)
    distilled: bool = False  # on-policy distillation: the teacher's signal alone needs no reward function

    def __post_init__(self) -> None:
        self.train_rows, self.eval_rows, self.reward_fns = list(self.train_rows), list(self.eval_rows), \
            list(self.reward_fns)
        weights = [1.0] * len(self.reward_fns) if self.reward_weights is None else list(self.reward_weights)
        if len(weights) != len(self.reward_fns) or not (self.reward_fns or self.env is not None or self.judge
                                                          or self.agent is not None or self.distilled):
            raise ValueError(f"{len(weights)} reward weights for {len(self.reward_fns)} reward functions (at least "
                             "one function, an environment, a judge or a teacher is needed)")
        self.reward_weights = weights
        prompted = self.env is None and self.agent is None  # an agent's row is whatever its function reads
        check_rows(self.train_rows, "train", needs_prompt=prompted)
        if self.eval_rows:
            check_rows(self.eval_rows, "eval", needs_prompt=prompted)
        agent_columns = list(AGENT_COLUMNS) if not prompted else []  # only an agent's rows carry them
        check_reward_columns(self.reward_fns, [k for k in self.train_rows[0] if k != "prompt"] + agent_columns)
