"""Where a completion stops: stop token ids, and stop strings (it ends at the token that completes the first one;
a vocabulary table marks the tokens that can, so only rows that drew one are decoded and searched)."""

from __future__ import annotations

from typing import Any

import torch

from grouprl.types import SamplingParams

_SENTENCEPIECE_SPACE = "\u2581"


def stop_token_ids(tokenizer: Any, params: SamplingParams) -> list[int]:
    """``params.stop_token_ids`` and the tokenizer's EOS."""
    ids = set(params.stop_token_ids)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)


def pad_id(tokenizer: Any) -> int:
    """The tokenizer's pad id, else its EOS, else 0."""
    return int(next(i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0) if i is not None))


def cut_at_stop(text: str, stop_strings: tuple[str, ...]) -> tuple[str, bool]:
    """``text`` cut right after the earliest-ending stop string, and whether one was found.

    >>> cut_at_stop("a=1\\n\\nb=2\\n\\n", ("\\n\\n", "=2"))
    ('a=1\\n\\n', True)
    """
    ends = [i + len(s) for s in stop_strings if (i := text.find(s)) >= 0]
    return (text[: min(ends)], True) if ends else (text, False)


def _candidate_table(tokenizer: Any, stop_strings: tuple[str, ...], vocab_size: int) -> torch.Tensor:
    """[vocab_size] bool: tokens whose arrival can complete one of ``stop_strings``."""
    n = min(len(tokenizer), vocab_size)
    texts = tokenizer.batch_decode([[i] for i in range(n)], skip_special_tokens=True,
                                   clean_up_tokenization_spaces=False)
    last_chars = {s[-1] for s in stop_strings}
    ends_in_space = any(c.isspace() for c in last_chars)
    pieces = tokenizer.convert_ids_to_tokens(list(range(n))) if ends_in_space else [""] * n
    table = torch.ones(vocab_size, dtype=torch.bool)  # ids past the tokenizer: assume the worst
    for i, (text, piece) in enumerate(zip(texts, pieces)):
        partial_char = "\ufffd" in text
        # SentencePiece drops a token's leading space when it is decoded alone.
        hidden_space = ends_in_space and (piece or "").startswith(_SENTENCEPIECE_SPACE)
        table[i] = partial_char or hidden_space or any(c in text for c in last_chars)
    return table


class StopStringMatcher:
    """Finds rows whose newest token completed a stop string; ``table`` is [V] bool."""

    def __init__(self, tokenizer: Any, stop_strings: tuple[str, ...], vocab_size: int):
        if any(not s for s in stop_strings):
            raise ValueError("stop_strings contains an empty string, which would stop every completion at once")
        self.tokenizer = tokenizer
        self.stop_strings = tuple(stop_strings)
        self.table = _candidate_table(tokenizer, self.stop_strings, vocab_size)
        self._tables = {self.table.device: self.table}  # one copy per device the sampler runs on

    def completed(self, history: torch.Tensor, rows: torch.Tensor, step: int, new_tokens: torch.Tensor) -> torch.Tensor:
        """[b] bool: which ``rows`` [b] end with a stop string after ``step``'s ``new_tokens`` [b]; ``history``
        [B, N] is by original row."""
        if new_tokens.device not in self._tables:
            self._tables[new_tokens.device] = self.table.to(new_tokens.device)
        table = self._tables[new_tokens.device]
        hits = torch.zeros_like(new_tokens, dtype=torch.bool)
        maybe = table[new_tokens].nonzero().flatten().tolist()
        if not maybe:
            return hits
        seqs = history[rows[maybe], : step + 1].tolist()
        texts = self.tokenizer.batch_decode(seqs, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        for i, text in zip(maybe, texts):
            hits[i] = any(s in text for s in self.stop_strings)
        return hits
