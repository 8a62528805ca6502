"""Chat messages as plain data: the one text helper that layers below the rollout engine (prompt
data, reward models) share with it."""

from __future__ import annotations

Prompt = str | list[dict[str, str]]
"""A prompt as a user gives it: plain text, or a list of ``{"role", "content"}`` messages."""


def to_messages(prompt: Prompt, system_prompt: str | None = None) -> list[dict[str, str]]:
    """``prompt`` as a list of chat messages, with ``system_prompt`` first if given.

    >>> to_messages("2+2?", system_prompt="Be brief.")
    [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': '2+2?'}]
    """
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system_prompt and not any(m.get("role") == "system" for m in messages):
        messages = [{"role": "system", "content": system_prompt}, *messages]
    return messages
