"""The trainer's keys of the rollout: the prompt's rendering, the sampler, and the budgets of agents' trajectories."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PromptKeys:
    SECTION = "model and data"

    max_prompt_len: int = 512
    """Longest prompt in tokens (after the chat template); a longer one is an error naming its row."""
    system_prompt: str | None = None
    """System message prepended to every chat prompt (empty = the task's own, if any)."""
    use_chat_template: bool = True
    """Render plain-text prompts as a user message through the tokenizer's chat template."""


@dataclass
class SamplingKeys:
    SECTION = "sampling"

    prompts_per_step: int = 4
    """P: prompts sampled per training step. Each step generates P * G completions."""
    group_size: int = 8
    """G: completions per prompt (>= 2). A larger G lowers the variance of the group baseline (DeepSeekMath: 64,
    TRL's default: 8, verl's examples: 5-16)."""
    max_new_tokens: int = 64
    """Longest completion in tokens; a longer one is cut and flagged truncated."""
    temperature: float = 1.0
    """Sampling temperature (and the temperature of the training log-probs). Must be > 0: a
    greedy group is G copies of one completion."""
    top_p: float = 1.0
    """Nucleus sampling (1.0 = off)."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""
    min_p: float = 0.0
    """Min-p sampling (0 = off)."""
    repetition_penalty: float = 1.0
    """Repetition penalty during sampling (1.0 = off)."""
    stop_strings: tuple[str, ...] = ()
    """Strings that end a completion (besides the tokenizer's EOS)."""
    rollout_mode: str = "sample"
    """sample: G independent samples per prompt; beam: the G best beams (a deterministic group)."""


@dataclass
class AgentKeys:
    SECTION = "agents (environments and tools)"

    max_turns: int = 8
    """Most policy turns per trajectory; a trajectory cut here is flagged truncated."""
    max_trajectory_tokens: int = 1024
    """Most tokens per trajectory after its first prompt, the policy's and the environment's
    together (the KV cache and the training passes grow with it)."""
    max_tool_calls: int = 4
    """Most tool calls per trajectory; later calls go to the environment as plain answers."""
    tool_parser: str = "hermes"
    """How tool calls are read from an assistant turn: hermes (<tool_call>{"name", "arguments"} </tool_call>, as
    Qwen's and SmolLM2's templates write them), a name in grouprl.envs.tools.TOOL_PARSERS, or the import path of a
    function (text) -> list[ToolCall]."""
    tool_timeout_s: float = 10.0
    """Seconds one tool call may take before its result is an error message to the model."""
    agent_timeout: float = 600.0
    """agent: seconds one trajectory of the agent may take; one that runs longer is dropped (its group is one
    smaller) and named in a warning."""
    gigpo_step_weight: float = 1.0
    """advantage=gigpo: w in A = A_episode + w * A_step (GiGPO, Feng et al. 2025: 1)."""
    gigpo_gamma: float = 0.95
    """advantage=gigpo: discount of the turn rewards in each turn's return R_t = r_t + gamma R_t+1
    (0.95 in every published GiGPO run)."""
    gigpo_similarity: float | None = None
    """advantage=gigpo: group turns whose state texts are this similar (difflib ratio, e.g. 0.95, as
    GiGPO's similarity mode) instead of only equal ones. Empty = equal keys only."""
