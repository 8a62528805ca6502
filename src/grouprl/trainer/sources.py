"""Where a trainer's experience comes from: prompts (one completion each) or environments (multi-turn
trajectories, tools). Both give a collector and an evaluation, so the step loop does not care which."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from grouprl.models import context_length, unwrap_ddp
from grouprl.rollout.prompts import encode_checked
from grouprl.trainer.collect import GroupCollector
from grouprl.trainer.config import TrainerConfig
from grouprl.trainer.evaluate import evaluate
from grouprl.trainer.inputs import RunInputs
from grouprl.trainer.rollout_plan import RolloutPlan, build_rollout
from grouprl.trainer.sampling import eval_params, rollout_params

Share = Callable[[int], tuple[int, int]]


class PromptSource:
    """One completion per prompt: prompts encoded once (a too-long one is an error naming its row)."""

    def __init__(self, config: TrainerConfig, inputs: RunInputs, policy: nn.Module, tokenizer: Any, plan: RolloutPlan,
                 sampler: Any, share: Share):
        c = config
        enc = dict(system_prompt=c.system_prompt if c.system_prompt is not None else inputs.system_prompt,
                   use_chat_template=c.use_chat_template, context=context_length(unwrap_ddp(policy)),
                   max_new_tokens=c.max_new_tokens)
        train_ids = encode_checked(tokenizer, inputs.train_rows, "train", c.max_prompt_len, places=inputs.train_places,
                                   **enc)
        self.eval_ids = encode_checked(tokenizer, inputs.eval_rows, "eval", c.max_prompt_len, places=inputs.eval_places,
                                      **enc)
        longest = max(map(len, [*train_ids, *self.eval_ids]), default=c.max_prompt_len) + c.max_new_tokens
        sampler = build_rollout(c, plan, policy, tokenizer, longest=longest, sampler=sampler)
        self.config, self.inputs, self.sampler = config, inputs, sampler
        stop = tuple(i for i in [tokenizer.eos_token_id] if i is not None)
        self.collector = GroupCollector(sampler, inputs.train_rows, train_ids, inputs.reward_fns, inputs.reward_weights,
                                        c, share, stop, judge=inputs.judge, judge_weight=inputs.judge_weight)

    def evaluate(self, first: int, stop: int) -> dict[str, float]:
        c, inputs = self.config, self.inputs
        return evaluate(self.sampler, self.eval_ids[first:stop], inputs.eval_rows[first:stop], params=eval_params(c),
                        k=c.eval_samples, reward_fns=inputs.reward_fns, reward_weights=inputs.reward_weights,
                        is_correct=inputs.is_correct, seed=c.seed, first=first)


class EnvSource:
    """Trajectories in environments, decoded together on the KV cache (:mod:`grouprl.rollout.agent`)."""

    def __init__(self, config: TrainerConfig, inputs: RunInputs, policy: nn.Module, tokenizer: Any, plan: RolloutPlan,
                 sampler: Any, share: Share):
        from grouprl.envs.tools import tools_system_prompt
        from grouprl.rollout.agent import AgentSampler, ChatRenderer
        from grouprl.rollout.turns import TurnLimits
        from grouprl.trainer.episodes import EnvCollector

        c = config
        if sampler is None:
            renderer = ChatRenderer(tokenizer, inputs.tools, c.system_prompt or inputs.system_prompt,
                                    tools_system_prompt(inputs.tools) if inputs.tools else None)
            length = context_length(unwrap_ddp(policy)) or c.max_prompt_len + c.max_trajectory_tokens
            engine = build_rollout(c, plan, policy, tokenizer, longest=length, multi_turn=True)
            sampler = AgentSampler(unwrap_ddp(policy), tokenizer, renderer,
                                   TurnLimits(c.max_new_tokens, c.max_turns, c.max_trajectory_tokens), engine=engine,
                                   compile_steps=plan.compile)
        self.config, self.inputs, self.sampler = config, inputs, sampler
        self.collector = EnvCollector(sampler, inputs.train_rows, inputs.env, inputs.tools, inputs.reward_fns,
                                      inputs.reward_weights, c, share, judge=inputs.judge,
                                      judge_weight=inputs.judge_weight)
        self.eval_collector = EnvCollector(sampler, inputs.eval_rows or inputs.train_rows, inputs.env, inputs.tools,
                                           inputs.reward_fns, inputs.reward_weights, c, share)

    def evaluate(self, first: int, stop: int) -> dict[str, float]:
        from grouprl.trainer.episodes import evaluate_episodes

        c = self.config
        return evaluate_episodes(self.eval_collector, self.inputs.eval_rows[first:stop], params=eval_params(c),
                                 k=c.eval_samples, seed=c.seed, first=first)


class AgentSource:
    """The user's own agent, calling the run's chat endpoint (:mod:`grouprl.trainer.agent_runs`)."""

    def __init__(self, config: TrainerConfig, inputs: RunInputs, policy: nn.Module, tokenizer: Any, plan: RolloutPlan,
                 sampler: Any, share: Share):
        from grouprl.envs.tools import resolve_tool_parser
        from grouprl.trainer.agent_runs import AgentCollector
        from grouprl.trainer.chat_endpoint import ChatEndpoint

        c = config
        context = context_length(unwrap_ddp(policy)) or c.max_prompt_len + c.max_trajectory_tokens
        self.sampler = build_rollout(c, plan, policy, tokenizer, longest=context, sampler=sampler)
        stop = tuple(i for i in [tokenizer.eos_token_id] if i is not None)
        pad = next(i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0) if i is not None)

        def collector(rows: list, params: Any) -> AgentCollector:
            endpoint = ChatEndpoint(self.sampler, tokenizer, params, resolve_tool_parser(c.tool_parser), context)
            return AgentCollector(endpoint, inputs.agent, rows, inputs.reward_fns, inputs.reward_weights, c, share, pad)

        self.config, self.inputs = config, inputs
        self.collector = collector(inputs.train_rows, rollout_params(c, stop))
        self.eval_collector = collector(inputs.eval_rows or inputs.train_rows, eval_params(c))

    def evaluate(self, first: int, stop: int) -> dict[str, float]:
        """``eval/mean_reward`` of ``eval_samples`` runs of the agent on each held-out row."""
        got = self.eval_collector.rewarded(self.inputs.eval_rows[first:stop], self.config.eval_samples)
        return {"eval/mean_reward": float(got.nanmean())}


def make_source(config: TrainerConfig, inputs: RunInputs, policy: nn.Module, tokenizer: Any, plan: RolloutPlan,
                sampler: Any, share: Share) -> PromptSource | EnvSource | AgentSource:
    """The user's agent or environments when ``inputs`` name one, else prompts."""
    if inputs.agent is not None:
        return AgentSource(config, inputs, policy, tokenizer, plan, sampler, share)
    kind = PromptSource if inputs.env is None else EnvSource
    return kind(config, inputs, policy, tokenizer, plan, sampler, share)
