"""One trajectory's side of the conversation: an environment, the tools, and what happened.

An :class:`Episode` is what the multi-turn engine talks to. ``start()`` resets the environment and
gives the opening messages; ``respond(action)`` takes one assistant turn (text) and returns the
messages that answer it, or None when the trajectory is over:

- a turn with tool calls (read by the configured parser) is answered by the tools, one ``tool``
  message per call, and the environment does not step; after ``max_tool_calls`` calls, a turn's
  text goes to the environment as a plain answer;
- any other turn is the environment's action: ``step(action)``; its reward is added to the
  return, and its observation is the next user turn unless the episode terminated or was truncated;
- an environment that raises ends the trajectory with reason ``error`` (the trainer drops it and
  its group is one smaller); the error is kept in ``error``.

Per policy turn it records the reward the turn earned and the key of the state the turn started
from (``info["state_key"]`` when the environment gives one, else the observation text as the
environment returned it; None after a tool reply), for step-level grouping.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grouprl.envs.base import Message, as_messages
from grouprl.envs.tools import Tool, ToolParser, ToolRunner, resolve_tool_parser


def _state_key(observation: Any, info: dict[str, Any]) -> Any:
    key = info.get("state_key") if isinstance(info, dict) else None
    if key is not None:
        return key
    return observation if isinstance(observation, str) else repr(observation)


class Episode:
    """One trajectory in ``env``; see the module docstring.

    Args:
        env: a text environment (``reset(*, seed, options)``, ``step(action)``).
        tools: the tools the policy may call.
        seed / options: the reset's seed and options (the dataset row).
        max_tool_calls: tool calls allowed over the trajectory.
        tool_parser: a name of :data:`~grouprl.envs.tools.TOOL_PARSERS`, an import path of a parser, or
            the parser itself (``text -> list[ToolCall]``).
        tool_timeout_s: seconds one tool call may take.
    """

    def __init__(self, env: Any, tools: Sequence[Tool] = (), *, seed: int | None = None,
                 options: dict[str, Any] | None = None, max_tool_calls: int = 4,
                 tool_parser: str | ToolParser = "hermes", tool_timeout_s: float = 10.0):
        self.env, self.seed, self.options = env, seed, options
        self.runner = ToolRunner(tools, tool_timeout_s) if tools else None
        self.parse = resolve_tool_parser(tool_parser) if isinstance(tool_parser, str) else tool_parser
        self.max_tool_calls = max_tool_calls
        self.messages: list[Message] = []
        self.opening = 0
        """How many of :attr:`messages` the reset opened with (a few-shot opening may hold assistant turns)."""
        self.return_ = 0.0
        self.tool_calls = self.tool_errors = 0
        self.success: bool | None = None
        self.state_keys: list[Any] = []
        """Per policy turn: the key of the state it started from."""
        self.step_rewards: list[float] = []
        """Per policy turn: the reward its action earned (0 for a turn the tools answered)."""
        self.end_reason: str | None = None
        self.error: str | None = None
        self._next_key: Any = None

    def start(self) -> list[Message]:
        """Reset the environment; the opening messages (a copy)."""
        try:
            observation, info = self.env.reset(seed=self.seed, options=self.options)
        except Exception as e:
            raise RuntimeError(f"environment {type(self.env).__name__} failed to reset (seed {self.seed}): "
                               f"{type(e).__name__}: {e}") from e
        self.messages = as_messages(observation)
        self.opening = len(self.messages)
        self._next_key = _state_key(observation, info or {})
        return list(self.messages)

    @property
    def final_answer(self) -> str | None:
        """The policy's last turn (what reward functions over the final answer score)."""
        return next((m["content"] for m in reversed(self.messages) if m["role"] == "assistant"), None)

    def respond(self, action: str) -> list[Message] | None:
        """The messages that answer the assistant turn ``action`` (appended to :attr:`messages` with it),
        or None when the trajectory is over (``end_reason`` says why)."""
        self.messages.append({"role": "assistant", "content": action})
        self.state_keys.append(self._next_key)
        calls = self.parse(action) if self.runner is not None else []
        if calls and self.tool_calls < self.max_tool_calls:
            return self._tool_replies(calls[: self.max_tool_calls - self.tool_calls])
        try:
            observation, reward, terminated, truncated, info = self.env.step(action)
        except Exception as e:  # noqa: BLE001 - the trajectory is dropped; the run goes on
            self.step_rewards.append(0.0)
            self.error, self.end_reason = f"{type(e).__name__}: {e}", "error"
            return None
        info = info or {}
        self.step_rewards.append(float(reward))
        self.return_ += float(reward)
        if "success" in info:
            self.success = bool(info["success"])
        if terminated or truncated:
            self.end_reason = "env"
            return None
        new = as_messages(observation)
        self._next_key = _state_key(observation, info)
        self.messages.extend(new)
        return new

    def _tool_replies(self, calls: list) -> list[Message]:
        self.step_rewards.append(0.0)
        self._next_key = None
        new = []
        for name, text, failed in self.runner.run(calls):
            self.tool_calls += 1
            self.tool_errors += failed
            new.append({"role": "tool", "name": name, "content": text})
        self.messages.extend(new)
        return new
