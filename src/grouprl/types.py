"""Shared data that crosses layer boundaries: prompts and chat messages, sampling settings, rollouts.

Shapes: P prompts, G completions per prompt, B = P*G rows, prompt-major (row ``p*G + g`` is sample ``g`` of
prompt ``p``), Lp prompt tokens, T completion tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

Prompt = str | list[dict[str, str]]  # plain text, or ``{"role", "content"}`` messages


def to_messages(prompt: Prompt, system_prompt: str | None = None) -> list[dict[str, str]]:
    """``prompt`` as a list of chat messages, with ``system_prompt`` first if given.

    >>> to_messages("2+2?", system_prompt="Be brief.")
    [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': '2+2?'}]
    """
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system_prompt and not any(m.get("role") == "system" for m in messages):
        messages = [{"role": "system", "content": system_prompt}, *messages]
    return messages


def group_rows(groups: torch.Tensor | list[int], group_size: int) -> torch.Tensor:
    """Row indices ``[len(groups) * G]`` of whole groups in a prompt-major batch.

    >>> group_rows([2, 0], 3).tolist()
    [6, 7, 8, 0, 1, 2]
    """
    idx = torch.as_tensor(groups, dtype=torch.long).view(-1, 1) * group_size + torch.arange(group_size).view(1, -1)
    return idx.view(-1)


@dataclass(frozen=True)
class SamplingParams:
    """How completions are drawn, by every rollout backend; the config keys of the same names document them.
    ``temperature`` 0 is greedy; ``top_k`` 0, ``top_p`` 1, ``min_p`` 0 and ``repetition_penalty`` 1 are off; the
    engine always adds the tokenizer's EOS to ``stop_token_ids``; ``mode`` is "sample" (G independent samples)
    or "beam" (the G best beams); ``format`` is the built-in engine's decode format (fp32, bf16, bf16-weights)."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    mode: str = "sample"
    format: str = "fp32"


@dataclass
class RolloutBatch:
    """G completions (or trajectories) for each of P prompts (or resets), prompt-major, on the engine's device. A
    trajectory's completion part holds the policy's turns and the environment's replies in order:
    ``sequence_mask`` is 1 on all, ``completion_mask`` only on the policy's tokens (loss, KL, entropy)."""

    prompt_ids: torch.Tensor
    """[B, Lp] long, left-padded (each prompt repeated for its G rows)."""
    prompt_mask: torch.Tensor  # [B, Lp] long
    completion_ids: torch.Tensor  # [B, T] long, right-padded
    completion_mask: torch.Tensor
    """[B, T] float32 (0/1), 1 on the policy's tokens (the tokens that count)."""
    sampling_logprobs: torch.Tensor
    """[B, T] float32, log-prob of each token under the distribution it was drawn from (after
    temperature and filtering); 0 on padding and on environment tokens."""
    truncated: torch.Tensor
    """[B] bool, True where the row was cut by a budget (max_new_tokens, or a trajectory's token or
    turn budget) rather than ended by a stop or its environment."""
    completions: list[str]
    """B decoded completion texts, cut at the stop string that ended the row (a trajectory's: its last turn)."""
    prompts: list[Any]  # B prompts as the user gave them
    group_size: int  # G (the rows per group when group_ids is None)
    pad_token_id: int = 0
    extras: dict[str, Any] = field(default_factory=dict)
    """Per-row data carried along for reward functions (dataset columns, lists of length B)."""
    sequence_mask: torch.Tensor | None = None
    """[B, T] float32, 1 on every token of the completion part; None when it is ``completion_mask`` (one turn)."""
    group_ids: torch.Tensor | None = None
    """[B] long: rows with equal ids are compared; None = groups of ``group_size`` consecutive rows."""
    info: dict[str, list[Any]] = field(default_factory=dict)
    """Per-row facts about how each row was made (turns, tool calls, the environment's return, why it
    ended), lists of length B; logged, never passed to reward functions."""

    @property
    def batch_size(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def num_prompts(self) -> int:
        return self.num_groups

    @property
    def lengths(self) -> torch.Tensor:
        """[B] long, the policy's completion tokens per row."""
        return self.completion_mask.sum(-1).long()

    @property
    def token_mask(self) -> torch.Tensor:
        """[B, T] float32: every token of the completion part (policy and environment)."""
        return self.completion_mask if self.sequence_mask is None else self.sequence_mask

    def group_index(self) -> torch.Tensor:
        """[B] long: each row's group, numbered 0.. in order of first appearance."""
        if self.group_ids is None:
            return torch.arange(self.batch_size) // self.group_size
        from grouprl.algos.groups import ByIds

        return ByIds(self.group_ids.cpu()).index

    @property
    def num_groups(self) -> int:
        return self.batch_size // self.group_size if self.group_ids is None else int(self.group_index().max()) + 1

    def rows_of_groups(self, groups: torch.Tensor | list[int]) -> torch.Tensor:
        """[n] long: the rows of ``groups`` (indices into 0..num_groups-1), group by group."""
        if self.group_ids is None:
            return group_rows(groups, self.group_size)
        index = self.group_index()
        return torch.cat([(index == int(g)).nonzero().flatten() for g in torch.as_tensor(groups).tolist()]
                         or [torch.zeros(0, dtype=torch.long)])

    def select_rows(self, rows: torch.Tensor | list[int]) -> RolloutBatch:
        """The rows ``rows`` in that order (every per-row field indexed alike)."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        rows_l = rows.tolist()
        changes: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                changes[f.name] = value[rows.to(value.device)]
            elif isinstance(value, list):
                changes[f.name] = [value[i] for i in rows_l]
            elif isinstance(value, dict):
                changes[f.name] = {k: [v[i] for i in rows_l] for k, v in value.items()}
        return replace(self, **changes)

    @staticmethod
    def cat(batches: list[RolloutBatch]) -> RolloutBatch:
        """Concatenate batches of the same G along rows, re-padded; groups of different batches stay apart."""
        if not batches:
            raise ValueError("RolloutBatch.cat needs at least one batch")
        if len(batches) == 1:
            return batches[0]
        g = batches[0].group_size
        if any(b.group_size != g for b in batches):
            raise ValueError("RolloutBatch.cat: batches have different group sizes")
        for name in ("extras", "info"):
            if any(set(getattr(b, name)) != set(getattr(batches[0], name)) for b in batches):
                raise ValueError(f"RolloutBatch.cat: batches carry different {name} columns")
        pad = batches[0].pad_token_id
        lp = max(b.prompt_ids.shape[1] for b in batches)
        t = max(b.completion_ids.shape[1] for b in batches)

        def left(x: torch.Tensor, width: int, value: float) -> torch.Tensor:
            return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

        def right(x: torch.Tensor, width: int, value: float) -> torch.Tensor:
            return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

        multi_turn = any(b.sequence_mask is not None for b in batches)
        by_ids = any(b.group_ids is not None for b in batches)
        offsets = torch.tensor([0] + [b.num_groups for b in batches[:-1]]).cumsum(0).tolist()
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
            extras={k: [v for b in batches for v in b.extras[k]] for k in batches[0].extras},
            sequence_mask=torch.cat([right(b.token_mask, t, 0) for b in batches]) if multi_turn else None,
            group_ids=torch.cat([b.group_index() + o for b, o in zip(batches, offsets)]) if by_ids else None,
            info={k: [v for b in batches for v in b.info[k]] for k in batches[0].info},
        )

    def to(self, device: torch.device | str) -> RolloutBatch:
        moved = {f.name: getattr(self, f.name).to(device) for f in fields(self)
                 if isinstance(getattr(self, f.name), torch.Tensor)}
        return replace(self, **moved)
