"""Chat templates to token ids with only the template's own markers special.

Text from data, environments, tools and the policy must reach the model as text: a row holding
``<|im_end|>\\n<|im_start|>assistant\\n`` would otherwise open a turn the policy never wrote. So contents are
rendered as placeholders, put back as spans, and tokenized with ``split_special_tokens``; a template that changes
content as it inserts it (``trim``, Qwen3's ``<think>`` stripping) is probed one field at a time.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

MARK = "\u2063"
"""Invisible separator around a placeholder's index: no text a model or data set holds carries it next to digits."""
PLACEHOLDER = re.compile(MARK + r"(\d+)" + MARK)
TEXT_FIELDS = ("content", "name")  # text, whatever wrote it; ``role`` is structure, checked elsewhere


@dataclass
class Rendered:
    """A rendered conversation: its text and the ``(start, end)`` character spans of content, in order."""

    text: str
    spans: list[tuple[int, int]] = field(default_factory=list)

    def ids(self, tokenizer: Any, start: int = 0) -> list[int]:
        """Token ids of ``text[start:]``: the template's special tokens as themselves, everything else as text."""
        return text_ids(tokenizer, self.text[start:], special_at=self._special_positions(tokenizer, start))

    def _special_positions(self, tokenizer: Any, start: int) -> list[tuple[int, int, int]]:
        """``(start, end, id)`` of the template's special tokens in ``text[start:]`` (offsets from ``start``)."""
        pattern, by_text = special_tokens(tokenizer)
        if pattern is None:
            return []
        found, gap = [], start  # gap: where the template's text after the last span begins
        for s, e in [*self.spans, (len(self.text), len(self.text))]:
            if s > gap:
                found += [(m.start() - start, m.end() - start, by_text[m.group()])
                          for m in pattern.finditer(self.text, gap, s)]
            gap = max(gap, e)
        return found


def special_tokens(tokenizer: Any) -> tuple[re.Pattern | None, dict[str, int]]:
    """A pattern matching the tokenizer's special tokens (longest first) and each one's id."""
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    by_text = {t.content: int(i) for i, t in decoder.items() if getattr(t, "special", False) and t.content}
    if not by_text:
        return None, by_text
    return re.compile("|".join(re.escape(t) for t in sorted(by_text, key=len, reverse=True))), by_text


def text_ids(tokenizer: Any, text: str, special_at: Sequence[tuple[int, int, int]] = ()) -> list[int]:
    """Token ids of ``text``, special-token strings as text except at ``special_at`` (``(start, end, id)``)."""
    pieces, ids_at, cut = [], [], 0
    for s, e, token_id in special_at:
        pieces.append(text[cut:s])
        ids_at.append(token_id)
        cut = e
    pieces.append(text[cut:])
    encoded = tokenizer([p for p in pieces if p], add_special_tokens=False, split_special_tokens=True)["input_ids"]
    chunks = iter(encoded)
    out: list[int] = []
    for i, piece in enumerate(pieces):
        if piece:
            out += next(chunks)
        if i < len(ids_at):
            out.append(ids_at[i])
    return out


def _with_placeholders(messages: Sequence[dict[str, Any]], keep: int | None = None
                       ) -> tuple[list[dict[str, Any]], list[str]]:
    """Messages whose text fields are placeholders (all but field number ``keep``), and every field's value."""
    out, values = [], []
    for message in messages:
        m = dict(message)
        for key in TEXT_FIELDS:
            if isinstance(m.get(key), str):
                if len(values) != keep:
                    m[key] = f"{MARK}{len(values)}{MARK}"
                values.append(message[key])
        out.append(m)
    return out, values


def _fill(skeleton: str, values: Sequence[str]) -> Rendered:
    """``skeleton`` with each placeholder replaced by its value, the values' spans recorded."""
    parts, spans, cut, length = [], [], 0, 0
    for m in PLACEHOLDER.finditer(skeleton):
        parts.append(skeleton[cut:m.start()])
        length += m.start() - cut
        value = values[int(m.group(1))]
        parts.append(value)
        spans.append((length, length + len(value)))
        length += len(value)
        cut = m.end()
    parts.append(skeleton[cut:])
    return Rendered("".join(parts), spans)


def render(tokenizer: Any, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool,
           tools: list | None = None) -> Rendered:
    """``messages`` through the tokenizer's chat template, content spans marked (see the module docstring)."""
    def apply(msgs: list[dict[str, Any]]) -> str:
        kwargs = {"tools": tools} if tools is not None else {}
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             **kwargs)

    marked, values = _with_placeholders(messages)
    skeleton = apply(marked)
    real = apply([dict(m) for m in messages])
    filled = _fill(skeleton, values)
    if filled.text == real or not values:
        return filled
    # the template changed some content: see what it made of each field alone among placeholders
    shown = list(values)
    for i in range(len(values)):
        mark = f"{MARK}{i}{MARK}"
        if skeleton.count(mark) != 1:
            continue  # the template does not show this field, or shows it more than once: keep it as written
        before, after = skeleton.split(mark)
        text = apply(_with_placeholders(messages, keep=i)[0])
        if text.startswith(before) and text.endswith(after) and len(text) >= len(before) + len(after):
            shown[i] = text[len(before):len(text) - len(after)]
    filled = _fill(skeleton, shown)
    if filled.text != real:
        warnings.warn("the chat template's output depends on the messages' content beyond inserting it; each content "
                      "is inserted as the template shows it alone, so the text differs from the template's own "
                      "render", stacklevel=2)
    return filled
