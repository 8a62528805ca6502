"""A small environment a tiny random model can learn, and a trainer factory for agent runs."""

from __future__ import annotations

import torch

from grouprl.envs import Tool, make_env_factory
from grouprl.models import tiny_causal_lm
from grouprl.trainer.inputs import RunInputs
from grouprl.trainer.trainer import Trainer
from tests.helpers.trainer import base_config, params_of


class DigitTalk:
    """Two turns: each pays the share of digits in the policy's turn; the reset names its seed (so
    a group's trajectories can be seen to share it)."""

    def __init__(self, turns: int = 2):
        self.turns, self.n, self.seed = turns, 0, None

    def reset(self, *, seed=None, options=None):
        self.n, self.seed = 0, seed
        return f"game {seed}: digits", {}

    def step(self, action):
        self.n += 1
        share = sum(ch.isdigit() for ch in action) / max(len(action), 1)
        done = self.n >= self.turns
        return f"again {self.n}", share, done, False, {"success": share > 0.5} if done else {}


def count(text: str) -> int:
    """Count the characters of a text.

    Args:
        text: the text.
    """
    return len(text)


def make_agent_trainer(tmp_path, env: str = "tests.helpers.agents:DigitTalk", options=None, tools=(), resets=8,
                       max_positions: int = 512, judge=None, judge_weight=None, reward_fns=(), reward_weights=(),
                       **overrides) -> Trainer:
    """A trainer of the tiny model on ``env`` with ``resets`` training resets (seeds 0..) and 4 held-out ones."""
    torch.manual_seed(0)
    model, tok = tiny_causal_lm(seed=0, max_positions=max_positions)
    settings = {"max_new_tokens": 4, "max_turns": 3, "max_trajectory_tokens": 64, "eval_every": 0, **overrides}
    config = base_config(tmp_path, **settings)
    inputs = RunInputs(train_rows=[{"seed": i} for i in range(resets)], reward_fns=list(reward_fns),
                       reward_weights=list(reward_weights) or [1.0] * len(reward_fns),
                       eval_rows=[{"seed": 100 + i} for i in range(4)], env=make_env_factory(env, options),
                       tools=[Tool.of(t) for t in tools], judge=judge, judge_weight=judge_weight)
    return Trainer(config, policy=model, tokenizer=tok, inputs=inputs)


class BreaksEveryThird(DigitTalk):
    """DigitTalk whose every third environment (in the order they are made) raises at its first step."""

    made = 0

    def __init__(self, turns: int = 2):
        super().__init__(turns)
        BreaksEveryThird.made += 1
        self.broken = BreaksEveryThird.made % 3 == 0

    def step(self, action):
        if self.broken:
            raise RuntimeError("the environment broke")
        return super().step(action)


class FewShotDigitTalk(DigitTalk):
    """DigitTalk whose reset opens with a solved example: a user turn, an assistant turn, then the question."""

    def reset(self, *, seed=None, options=None):
        question, info = super().reset(seed=seed, options=options)
        return [{"role": "user", "content": "example: digits"}, {"role": "assistant", "content": "EXAMPLE-123"},
                {"role": "user", "content": question}], info


def train_two_steps(trainer) -> list[dict]:
    """Train ``trainer`` (two steps); its parameters must move. The records of both steps' episodes."""
    before = params_of(trainer.policy)
    trainer.train()
    after = params_of(trainer.policy)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    records = [r for r in trainer.metrics_log.records() if "env/return_mean" in r]
    assert [r["step"] for r in records] == [1, 2]
    return records
