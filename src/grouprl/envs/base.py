"""The text-environment protocol: the gymnasium/GEM shape with text actions, so existing environments plug in:

    reset(*, seed: int | None = None, options: dict | None = None) -> (observation, info)
    step(action: str) -> (observation, reward, terminated, truncated, info)

An observation is text (one user turn) or chat messages; ``options`` carries the dataset row; ``info`` may hold
``success`` and ``state_key``."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from grouprl.registry import Registry

Message = dict[str, Any]
"""A chat message: ``{"role": ..., "content": ...}`` (tool messages also carry ``name``)."""
Observation = str | list[Message]
"""What an environment shows the policy: one user turn's text, or messages to append."""


@runtime_checkable
class TextEnv(Protocol):
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[Observation, dict[str, Any]]: ...

    def step(self, action: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]: ...


ENVIRONMENTS: Registry[Callable[..., TextEnv]] = Registry("environment")
"""name -> factory ``(**options) -> TextEnv`` of the built-in environments."""
ROLE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}")
"""A message's role is a name: the template writes it between its markers, as structure."""


def as_messages(observation: Observation, role: str = "user") -> list[Message]:
    """An observation as messages to append: text becomes one ``role`` message; anything but text or messages
    (a named ``role``, text ``content``) is a TypeError.

    >>> as_messages("Too low."), as_messages([{"role": "user", "content": "hi"}])
    ([{'role': 'user', 'content': 'Too low.'}], [{'role': 'user', 'content': 'hi'}])
    """
    if isinstance(observation, str):
        return [{"role": role, "content": observation}]
    if isinstance(observation, list) and observation and all(_is_message(m) for m in observation):
        return [dict(m) for m in observation]
    raise TypeError("an observation is text or a non-empty list of chat messages, each with a 'role' (a name) and "
                    f"'content' (text); got {type(observation).__name__} {observation!r:.200}")


def _is_message(m: Any) -> bool:
    return (isinstance(m, dict) and isinstance(m.get("role"), str) and ROLE.fullmatch(m["role"]) is not None
            and isinstance(m.get("content"), str) and isinstance(m.get("name", ""), str))


def transcript(messages: Sequence[Message]) -> str:
    """A trajectory's turns from the policy's first one on, each headed by its role (what a judge reads).

    >>> print(transcript([{"role": "user", "content": "Guess 1-8."}, {"role": "assistant", "content": "4"},
    ...                   {"role": "user", "content": "Higher."}, {"role": "assistant", "content": "6"}]))
    assistant: 4
    <BLANKLINE>
    user: Higher.
    <BLANKLINE>
    assistant: 6
    """
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages[first:])
