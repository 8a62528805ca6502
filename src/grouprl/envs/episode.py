"""One trajectory's side of the conversation: an environment, the tools, and what happened.

The multi-turn engine calls ``start()`` then ``respond(action)`` per assistant turn: the tools answer tool calls,
the environment's ``step`` any other turn. A misbehaving environment ends its trajectory (reason ``error``), not
the run."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from grouprl.envs.base import Message, as_messages
from grouprl.envs.tools import PendingCalls, Tool, ToolCall, ToolParser, ToolRunner, resolve_tool_parser
from grouprl.errors import Interrupted

ERROR_CHARS = 500  # of an environment's exception message


def _state_key(observation: Any, info: dict[str, Any]) -> Any:
    """``info["state_key"]`` (hashable: steps are grouped by it), else the observation."""
    key = info.get("state_key") if isinstance(info, dict) else None
    if key is not None:
        hash(key)
        return key
    return observation if isinstance(observation, str) else repr(observation)


class Episode:
    """One trajectory in ``env``, reset with ``seed`` and ``options`` (the dataset row); ``max_tool_calls``
    counts over the trajectory; ``tool_parser`` is a name, an import path or the parser itself."""

    def __init__(self, env: Any, tools: Sequence[Tool] = (), *, seed: int | None = None,
                 options: dict[str, Any] | None = None, max_tool_calls: int = 4,
                 tool_parser: str | ToolParser = "hermes", tool_timeout_s: float = 10.0):
        self.env, self.seed, self.options = env, seed, options
        self.runner = ToolRunner(tools, tool_timeout_s) if tools else None
        self.parse = resolve_tool_parser(tool_parser) if isinstance(tool_parser, str) else tool_parser
        self.max_tool_calls = max_tool_calls
        self.messages: list[Message] = []
        self.opening = 0  # messages the reset opened with (a few-shot opening may hold assistant turns)
        self.return_ = 0.0
        self.tool_calls = self.tool_errors = 0
        self.success: bool | None = None
        self.state_keys: list[Any] = []  # per policy turn
        self.step_rewards: list[float] = []  # per policy turn; 0 for a turn the tools answered
        self.end_reason: str | None = None
        self.error: str | None = None
        self._next_key: Any = None

    @property
    def name(self) -> str:
        return f"environment {type(self.env).__name__} (seed {self.seed})"

    def _fail(self, when: str, error: BaseException | str) -> None:
        if isinstance(error, Interrupted):
            raise error
        what = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        self.error, self.end_reason = f"{self.name} {when}: {what}"[:ERROR_CHARS], "error"

    def start(self) -> list[Message] | None:
        """Reset the environment; the opening messages (a copy), or None when the reset failed (``error``)."""
        try:
            observation, info = self.env.reset(seed=self.seed, options=self.options)
            self.messages = as_messages(observation)
            self._next_key = _state_key(observation, info if isinstance(info, dict) else {})
        except BaseException as e:  # noqa: BLE001 - the trajectory is dropped; the run goes on
            self._fail("failed to reset", e)
            self.messages = []
            return None
        self.opening = len(self.messages)
        return list(self.messages)

    @property
    def final_answer(self) -> str | None:
        """The policy's last turn."""
        return next((m["content"] for m in reversed(self.messages) if m["role"] == "assistant"), None)

    def respond(self, action: str) -> list[Message] | None:
        """The messages that answer the assistant turn ``action`` (both appended to :attr:`messages`), or None when
        the trajectory is over (``end_reason`` says why)."""
        return self.finish(self.begin(action))

    def begin(self, action: str) -> PendingCalls | None:
        """The first half of :meth:`respond`: record the turn, start its tool calls (None: the environment answers)."""
        self.messages.append({"role": "assistant", "content": action})
        self.state_keys.append(self._next_key)
        if self.end_reason is not None or self.runner is None or self.tool_calls >= self.max_tool_calls:
            return None
        try:
            calls = list(self.parse(action))
        except BaseException as e:  # noqa: BLE001 - a parser that fails answers the turn with its error
            if isinstance(e, Interrupted):
                raise
            calls = [ToolCall(None, {}, f"the tool call could not be read: {type(e).__name__}")]
        if not calls:
            return None
        return self.runner.start(calls[: self.max_tool_calls - self.tool_calls])

    def finish(self, pending: PendingCalls | None) -> list[Message] | None:
        """The second half of :meth:`respond`: the tools' answers, or the environment's step."""
        if self.end_reason is not None:  # its reset failed: nothing answers
            self.step_rewards.append(0.0)
            return None
        if pending is not None:
            return self._tool_replies(pending.results())
        return self._step(self.messages[-1]["content"])

    def _step(self, action: str) -> list[Message] | None:
        try:
            observation, reward, terminated, truncated, info = self.env.step(action)
            reward = _reward(reward)
            info = dict(info or {})
            success = bool(info["success"]) if "success" in info else self.success
            done = bool(terminated or truncated)
            new = None if done else as_messages(observation)
            key = None if done else _state_key(observation, info)
        except BaseException as e:  # noqa: BLE001 - the trajectory is dropped; the run goes on
            self.step_rewards.append(0.0)
            self._fail("failed at a step", e)
            return None
        self.step_rewards.append(reward)
        self.return_ += reward
        self.success = success
        if new is None:
            self.end_reason = "env"
            return None
        self._next_key = key
        self.messages.extend(new)
        return new

    def _tool_replies(self, results: list[tuple[str, str, bool]]) -> list[Message]:
        self.step_rewards.append(0.0)
        self._next_key = None
        new = []
        for name, text, failed in results:
            self.tool_calls += 1
            self.tool_errors += failed
            new.append({"role": "tool", "name": name, "content": text})
        self.messages.extend(new)
        return new


def _reward(value: Any) -> float:
    if value is None or isinstance(value, str | bytes):
        raise TypeError(f"the reward must be a number, got {type(value).__name__} {value!r:.80}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"the reward must be a finite number, got {number}")
    return number


def respond_all(episodes: Sequence[Episode], actions: Sequence[str]) -> list[list[Message] | None]:
    """:meth:`Episode.respond` for each episode: every trajectory's tool calls start before any is waited for."""
    pending: list[PendingCalls | None] = []
    try:
        for episode, action in zip(episodes, actions, strict=True):
            pending.append(episode.begin(action))
        return [episode.finish(calls) for episode, calls in zip(episodes, pending)]
    finally:  # interrupted: no tool process is left running
        for calls in pending:
            if calls is not None:
                calls.cancel()
