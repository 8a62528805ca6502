"""Where a trainer's experience comes from: prompts (one completion each, the built-in or a given
engine) or environments (multi-turn trajectories, tools). Both give the trainer a collector for
training steps and an evaluation of a share of the held-out rows, so the step loop does not care
which it has."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from grouprl.models import context_length, unwrap_ddp
from grouprl.rollout.prompts import encode_checked
from grouprl.rollout.sampler import Sampler
from grouprl.trainer.collect import GroupCollector
from grouprl.trainer.evaluate import EVAL_BATCH, evaluate
from grouprl.trainer.inputs import RunInputs
from grouprl.trainer.sampling import eval_params

Share = Callable[[int], tuple[int, int]]


class PromptSource:
    """One completion per prompt: prompts encoded once (a too-long one is an error naming its row)."""

    def __init__(self, config: Any, inputs: RunInputs, policy: nn.Module, tokenizer: Any, sampler: Any, share: Share):
        c = config
        enc = dict(system_prompt=c.system_prompt if c.system_prompt is not None else inputs.system_prompt,
                   use_chat_template=c.use_chat_template, context=context_length(unwrap_ddp(policy)),
                   max_new_tokens=c.max_new_tokens)
        train_ids = encode_checked(tokenizer, inputs.train_rows, "train", c.max_prompt_len, places=inputs.train_places,
                                   **enc)
        self.eval_ids = encode_checked(tokenizer, inputs.eval_rows, "eval", c.max_prompt_len, places=inputs.eval_places,
                                      **enc)
        if sampler is None and c.engine_choice == "vllm":
            longest = max(map(len, [*train_ids, *self.eval_ids]), default=c.max_prompt_len)
            sampler = vllm_engine(c, policy, tokenizer, longest + c.max_new_tokens)
        elif sampler is None:
            sampler = Sampler(unwrap_ddp(policy), tokenizer, compile_steps=c.compile_steps)
        elif isinstance(sampler, Sampler):  # decode through the root (FSDP) or the module inside DDP
            sampler.update_weights(unwrap_ddp(policy))
        self.config, self.inputs, self.sampler = config, inputs, sampler
        stop = tuple(i for i in [tokenizer.eos_token_id] if i is not None)
        self.collector = GroupCollector(sampler, inputs.train_rows, train_ids, inputs.reward_fns, inputs.reward_weights,
                                        c, share, stop, judge=inputs.judge, judge_weight=inputs.judge_weight)

    def evaluate(self, first: int, stop: int) -> dict[str, float]:
        """Held-out metrics of held-out rows ``first .. stop - 1``."""
        c, inputs = self.config, self.inputs
        return evaluate(self.sampler, self.eval_ids[first:stop], inputs.eval_rows[first:stop], params=eval_params(c),
                        k=c.eval_samples, reward_fns=inputs.reward_fns, reward_weights=inputs.reward_weights,
                        is_correct=inputs.is_correct, seed=c.seed, first=first)


class EnvSource:
    """Trajectories in environments, decoded together on the KV cache (:mod:`grouprl.rollout.agent`)."""

    def __init__(self, config: Any, inputs: RunInputs, policy: nn.Module, tokenizer: Any, sampler: Any, share: Share):
        from grouprl.envs.tools import tools_system_prompt
        from grouprl.rollout.agent import AgentSampler, ChatRenderer
        from grouprl.rollout.turns import TurnLimits
        from grouprl.trainer.episodes import EnvCollector

        c = config
        if sampler is None:
            renderer = ChatRenderer(tokenizer, inputs.tools, c.system_prompt or inputs.system_prompt,
                                    tools_system_prompt(inputs.tools) if inputs.tools else None)
            length = context_length(unwrap_ddp(policy)) or c.max_prompt_len + c.max_trajectory_tokens
            engine = vllm_engine(c, policy, tokenizer, length) if c.engine_choice == "vllm" else None
            sampler = AgentSampler(unwrap_ddp(policy), tokenizer, renderer,
                                   TurnLimits(c.max_new_tokens, c.max_turns, c.max_trajectory_tokens), engine=engine,
                                   compile_steps=c.compile_steps)
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


def vllm_engine(config: Any, policy: nn.Module, tokenizer: Any, max_model_len: int) -> Any:
    """A colocated vLLM engine following ``policy``, in the rollout format ``dtype`` chose."""
    from grouprl.rollout.vllm import VLLMSampler

    c = config
    rows = max(c.rollout_rows, EVAL_BATCH * c.eval_samples)  # a rollout's rows, or an evaluation batch's
    return VLLMSampler(unwrap_ddp(policy), tokenizer, max_model_len=max_model_len,
                       dtype="bfloat16" if c.rollout_bf16 else "float32", seed=c.seed,
                       lora_rank=c.lora_rank or None, gpu_memory_utilization=c.vllm_gpu_memory_utilization,
                       sleep=c.vllm_sleep, kv_cache_gib=c.vllm_kv_cache_gib, max_rows=rows,
                       compiled=c.vllm_compile)


def make_source(config: Any, inputs: RunInputs, policy: nn.Module, tokenizer: Any, sampler: Any,
                share: Share) -> PromptSource | EnvSource:
    """The experience source ``inputs`` call for: environments when they name one, else prompts."""
    kind = PromptSource if inputs.env is None else EnvSource
    return kind(config, inputs, policy, tokenizer, sampler, share)
