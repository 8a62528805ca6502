"""User prompts (a string or ``{"role", "content"}`` messages) to token ids. Messages always go through the chat
template; a string is one user message when ``use_chat_template`` is on, else verbatim. Special-token text in a
prompt is tokenized as its characters (:mod:`grouprl.data.templates`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grouprl.data.prompt_sets import context_overflow
from grouprl.data.templates import render, text_ids
from grouprl.errors import PromptTooLongError
from grouprl.types import Prompt, to_messages

__all__ = ["Prompt", "encode_checked", "encode_prompt", "encode_prompts", "render_prompt", "to_messages"]


def _check_template(tokenizer: Any) -> None:
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "the prompts are chat messages (or use_chat_template is on) but the tokenizer has no chat "
            "template; give plain-text prompts with use_chat_template=False, or a tokenizer with a template"
        )


def render_prompt(tokenizer: Any, prompt: Prompt, *, system_prompt: str | None = None,
                  use_chat_template: bool = True) -> str:
    """The exact text the model is conditioned on, generation prompt included."""
    if isinstance(prompt, str) and not use_chat_template:
        return prompt if not system_prompt else f"{system_prompt}\n\n{prompt}"
    _check_template(tokenizer)
    return render(tokenizer, to_messages(prompt, system_prompt), add_generation_prompt=True).text


def encode_prompt(tokenizer: Any, prompt: Prompt, *, system_prompt: str | None = None,
                  use_chat_template: bool = True) -> list[int]:
    """Token ids of the rendered ``prompt``: the template's markers special, the prompt's own text as text."""
    if isinstance(prompt, str) and not use_chat_template:
        return text_ids(tokenizer, render_prompt(tokenizer, prompt, system_prompt=system_prompt,
                                                 use_chat_template=False))
    _check_template(tokenizer)
    return render(tokenizer, to_messages(prompt, system_prompt), add_generation_prompt=True).ids(tokenizer)


def encode_prompts(tokenizer: Any, prompts: Sequence[Prompt], *, system_prompt: str | None = None,
                   use_chat_template: bool = True) -> list[list[int]]:
    """Token ids of each rendered prompt (no padding); P prompts -> P lists."""
    return [encode_prompt(tokenizer, p, system_prompt=system_prompt, use_chat_template=use_chat_template)
            for p in prompts]


def encode_checked(tokenizer: Any, rows: Sequence[dict[str, Any]], what: str, max_len: int, *,
                   system_prompt: str | None, use_chat_template: bool, context: int | None = None,
                   max_new_tokens: int = 0, places: Sequence[str] = ()) -> list[list[int]]:
    """Token ids of every row's prompt; one too long (``max_len``, or ``context`` with ``max_new_tokens``) or empty
    is a :class:`~grouprl.errors.PromptTooLongError` naming its row (``places[i]``, else its index in ``what``)."""
    ids = encode_prompts(tokenizer, [r["prompt"] for r in rows], system_prompt=system_prompt,
                         use_chat_template=use_chat_template)
    if context is not None and max_new_tokens >= context:
        raise PromptTooLongError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in the model's "
                                 f"context of {context} tokens")
    for i, row_ids in enumerate(ids):
        quoted = f"Prompt: {rows[i]['prompt']!r:.200}"
        row = f"{what} row {i} ({places[i]})" if places else f"{what} row {i}"
        if len(row_ids) > max_len:
            raise PromptTooLongError(
                f"{row}: the prompt is {len(row_ids)} tokens after the chat template, over "
                f"max_prompt_len={max_len}; shorten it or raise max_prompt_len. {quoted}")
        if context is not None and len(row_ids) + max_new_tokens > context:
            message = context_overflow(row, len(row_ids), context, "max_new_tokens", max_new_tokens, max(map(len, ids)))
            raise PromptTooLongError(f"{message} {quoted}")
        if not row_ids:
            raise PromptTooLongError(f"{row}: the prompt is empty")
    return ids
