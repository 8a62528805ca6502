"""Shared dataclasses that cross layer boundaries.

Shape vocabulary (DESIGN.md): P prompts, G completions per prompt, B = P*G rows, prompt-major
(row ``p*G + g`` is sample ``g`` of prompt ``p``), Lp prompt tokens, T completion tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How completions are drawn. Shared by every rollout backend (HF engine, vLLM)."""

    max_new_tokens: int = 64
    """Longest completion; a row that reaches it without a stop is flagged truncated."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy decoding. GRPO needs diversity within a group, so 1.0
    (the DeepSeekMath setting and TRL's default) is the default."""
    top_k: int = 0
    """Keep only the k most likely tokens (0 = off)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability sums to top_p (1.0 = off)."""
    min_p: float = 0.0
    """Drop tokens whose probability is below min_p times the most likely token's (0 = off)."""
    repetition_penalty: float = 1.0
    """CTRL-style penalty on tokens already in the prompt or completion (1.0 = off)."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end a completion (the tokenizer's EOS is always added by the engine)."""
    stop_strings: tuple[str, ...] = ()
    """Strings that end a completion; the completion is cut right after the first one."""
    mode: str = "sample"
    """"sample" draws G independent samples per prompt; "beam" returns the G best beams."""
    autocast_bf16: bool = False
    """Run the decode forward passes under bf16 autocast (AMX on recent x86 CPUs)."""


@dataclass
class RolloutBatch:
    """G completions for each of P prompts, prompt-major.

    Tensors live on the device the engine ran on. ``completion_ids`` is right-padded with
    ``pad_token_id`` and ``completion_mask`` is 1 on every generated token up to and including
    the one that ended the row (EOS / stop token, or the last token of a stop string).
    """

    prompt_ids: torch.Tensor
    """[B, Lp] long, left-padded (each prompt repeated for its G rows)."""
    prompt_mask: torch.Tensor
    """[B, Lp] long, 1 on real prompt tokens."""
    completion_ids: torch.Tensor
    """[B, T] long, right-padded."""
    completion_mask: torch.Tensor
    """[B, T] float32 (0/1), 1 on completion tokens that count."""
    sampling_logprobs: torch.Tensor
    """[B, T] float32, log-prob of each token under the distribution it was drawn from (after
    temperature and filtering); 0 on padding."""
    truncated: torch.Tensor
    """[B] bool, True where the row hit max_new_tokens without a stop."""
    completions: list[str]
    """B decoded completion texts, cut at the stop string where one ended the row."""
    prompts: list[Any]
    """B prompts as the user gave them (text or chat messages), repeated per group."""
    group_size: int
    """G."""
    pad_token_id: int = 0
    extras: dict[str, Any] = field(default_factory=dict)
    """Per-row data carried along for reward functions (dataset columns, lists of length B)."""

    @property
    def batch_size(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def num_prompts(self) -> int:
        return self.batch_size // self.group_size

    @property
    def lengths(self) -> torch.Tensor:
        """[B] long, number of counted completion tokens per row."""
        return self.completion_mask.sum(-1).long()

    def select_groups(self, groups: torch.Tensor | list[int]) -> RolloutBatch:
        """Keep whole groups (prompt indices into 0..P-1), in the given order."""
        g = self.group_size
        idx = torch.as_tensor(groups, dtype=torch.long).view(-1, 1) * g + torch.arange(g).view(1, -1)
        rows = idx.view(-1)  # [P' * G]
        rows_l = rows.tolist()
        return replace(
            self,
            prompt_ids=self.prompt_ids[rows.to(self.prompt_ids.device)],
            prompt_mask=self.prompt_mask[rows.to(self.prompt_mask.device)],
            completion_ids=self.completion_ids[rows.to(self.completion_ids.device)],
            completion_mask=self.completion_mask[rows.to(self.completion_mask.device)],
            sampling_logprobs=self.sampling_logprobs[rows.to(self.sampling_logprobs.device)],
            truncated=self.truncated[rows.to(self.truncated.device)],
            completions=[self.completions[i] for i in rows_l],
            prompts=[self.prompts[i] for i in rows_l],
            extras={k: [v[i] for i in rows_l] for k, v in self.extras.items()},
        )

    @staticmethod
    def cat(batches: list[RolloutBatch]) -> RolloutBatch:
        """Concatenate batches of the same G along rows, re-padding prompts (left) and
        completions (right) to the longest."""
        if not batches:
            raise ValueError("RolloutBatch.cat needs at least one batch")
        if len(batches) == 1:
            return batches[0]
        g = batches[0].group_size
        if any(b.group_size != g for b in batches):
            raise ValueError("RolloutBatch.cat: batches have different group sizes")
        pad = batches[0].pad_token_id
        lp = max(b.prompt_ids.shape[1] for b in batches)
        t = max(b.completion_ids.shape[1] for b in batches)

        def left(x: torch.Tensor, width: int, value: float) -> torch.Tensor:
            return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

        def right(x: torch.Tensor, width: int, value: float) -> torch.Tensor:
            return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

        extras_keys = set(batches[0].extras)
        if any(set(b.extras) != extras_keys for b in batches):
            raise ValueError("RolloutBatch.cat: batches carry different extra columns")
        return RolloutBatch(
            prompt_ids=torch.cat([left(b.prompt_ids, lp, pad) for b in batches]),
            prompt_mask=torch.cat([left(b.prompt_mask, lp, 0) for b in batches]),
            completion_ids=torch.cat([right(b.completion_ids, t, pad) for b in batches]),
            completion_mask=torch.cat([right(b.completion_mask, t, 0) for b in batches]),
            sampling_logprobs=torch.cat([right(b.sampling_logprobs, t, 0) for b in batches]),
            truncated=torch.cat([b.truncated for b in batches]),
            completions=[c for b in batches for c in b.completions],
            prompts=[p for b in batches for p in b.prompts],
            group_size=g,
            pad_token_id=pad,
            extras={k: [v for b in batches for v in b.extras[k]] for k in extras_keys},
        )

    def to(self, device: torch.device | str) -> RolloutBatch:
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return replace(self, **moved)
