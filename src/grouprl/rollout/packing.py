"""Padding-free layout for the training forward passes: each run of rows with the same prompt is one sequence
``[prompt | completion 1 | ... | completion G]`` under a 4D mask (a completion token sees the prompt and its own
earlier tokens); positions restart after the prompt for every completion, so log-probs equal the padded layout's.
Sequences share rows as wide as the longest one (first-fit decreasing).

Shapes: B rows, Lp prompt columns, T completion columns, S sequences, R rows they are packed into, L the rows'
width, n completion tokens that count."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from grouprl.registry import Registry

PROMPT, PAD = -1, -2  # owner codes of packed positions; completion tokens carry their row index


@dataclass
class Packed:
    """One packed forward's inputs and where to read each completion token's prediction from."""

    input_ids: torch.Tensor
    """[R, L] long, 0 where no sequence is."""
    position_ids: torch.Tensor
    """[R, L] long: 0.. over each prompt; the prompt length onwards again for every completion."""
    allowed: torch.Tensor
    """[R, L, L] bool: query position i may attend key position j."""
    predictor: torch.Tensor
    """[n] long, flat index into R * L of the position predicting each completion token (mask order)."""


def _segments(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
    """[B] long: the packed sequence of each row (consecutive rows with identical prompts share one)."""
    same = torch.ones(prompt_ids.shape[0], dtype=torch.bool, device=prompt_ids.device)  # [B]
    same[0] = False
    if prompt_ids.shape[0] > 1:
        same[1:] = ((prompt_ids[1:] == prompt_ids[:-1]) | (prompt_mask[1:] == 0)).all(-1) & \
                   (prompt_mask[1:] == prompt_mask[:-1]).all(-1)
    return (~same).long().cumsum(0) - 1


def pack_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                completion_mask: torch.Tensor, sequence_mask: torch.Tensor | None = None) -> Packed:
    """Left-padded prompts ``[B, Lp]`` and right-padded completions ``[B, T]`` packed: ``sequence_mask`` (a prefix
    mask, default ``completion_mask``) lays tokens out, ``completion_mask`` scores them."""
    device = prompt_ids.device
    b, lp_cols = prompt_ids.shape
    seg = _segments(prompt_ids, prompt_mask)  # [B]
    s = int(seg[-1]) + 1
    lp = prompt_mask.long().sum(-1)  # [B] real prompt tokens
    lc = (completion_mask if sequence_mask is None else sequence_mask).long().sum(-1)  # [B] completion tokens
    fed = (lc - 1).clamp(min=0)  # [B] completion tokens run through the model (the last predicts nothing)

    # Where each row's fed tokens start: after its prompt and the earlier rows of its sequence.
    before = torch.cumsum(fed, 0) - fed  # [B] exclusive prefix sum over all rows
    first = torch.zeros(s, dtype=torch.long, device=device).scatter_reduce(
        0, seg, torch.arange(b, device=device), "amin", include_self=False)  # [S] first row of each sequence
    start = lp + before - before[first][seg]  # [B] within the row's sequence
    seq_len = lp[first] + torch.zeros(s, dtype=torch.long, device=device).index_add(0, seg, fed)  # [S]
    row_of, offset, width = _first_fit(seq_len.tolist())
    row_of, offset = torch.tensor(row_of, device=device), torch.tensor(offset, device=device)  # [S], [S]
    rows = int(row_of.max()) + 1

    ids = torch.zeros(rows, width, dtype=torch.long, device=device)
    pos = torch.zeros(rows, width, dtype=torch.long, device=device)
    owner = torch.full((rows, width), PAD, dtype=torch.long, device=device)
    sequence = torch.full((rows, width), PAD, dtype=torch.long, device=device)

    # Prompt tokens: the real (right-aligned) tokens of each sequence's first row.
    ps, pc = prompt_mask[first].nonzero(as_tuple=True)  # [m] sequence, column
    at = pc - (lp_cols - lp[first][ps])  # [m] index within the sequence
    r, c = row_of[ps], offset[ps] + at
    ids[r, c], pos[r, c], owner[r, c], sequence[r, c] = prompt_ids[first][ps, pc], at, PROMPT, ps

    # Completion tokens 0 .. fed-1 of every row.
    cols = torch.arange(completion_ids.shape[1], device=device)
    cr, cc = (cols.unsqueeze(0) < fed.unsqueeze(1)).nonzero(as_tuple=True)  # [k] row, column
    r, c = row_of[seg[cr]], offset[seg[cr]] + start[cr] + cc
    ids[r, c], pos[r, c], owner[r, c], sequence[r, c] = completion_ids[cr, cc], lp[cr] + cc, cr, seg[cr]

    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()  # [L, L]
    same_sequence = (sequence.unsqueeze(2) == sequence.unsqueeze(1)) & (sequence != PAD).unsqueeze(1)  # [R, L, L]
    visible = (owner == PROMPT).unsqueeze(1) | (owner.unsqueeze(2) == owner.unsqueeze(1))  # prompt, or own row
    allowed = causal & same_sequence & visible
    allowed |= torch.eye(width, dtype=torch.bool, device=device)  # padding queries see themselves: no empty row

    # Token j of row r is predicted by the last prompt position (j = 0) or by its token j - 1.
    tr, tc = (completion_mask.reshape(b, -1) > 0).nonzero(as_tuple=True)  # [n], row-major like the mask
    at = offset[seg[tr]] + torch.where(tc == 0, lp[tr] - 1, start[tr] + tc - 1)
    return Packed(input_ids=ids, position_ids=pos, allowed=allowed, predictor=row_of[seg[tr]] * width + at)


def _first_fit(lengths: list[int]) -> tuple[list[int], list[int], int]:
    """First-fit decreasing into rows as wide as the longest: (row of each sequence, its offset, the width)."""
    width = max(lengths)
    free: list[int] = []  # room left in each row
    row_of, offset = [0] * len(lengths), [0] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        row = next((r for r, room in enumerate(free) if room >= lengths[i]), len(free))
        if row == len(free):
            free.append(width)
        row_of[i], offset[i] = row, width - free[row]
        free[row] -= lengths[i]
    return row_of, offset, width


# -- the mask in the form each attention implementation takes -----------------------------------------
def _bool_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return allowed.unsqueeze(1)  # [S, 1, L, L]


def _additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min).unsqueeze(1)  # [S, 1, L, L]


MASK_FORMS: Registry[Callable[[torch.Tensor, torch.dtype], torch.Tensor]] = Registry("attention implementation")
"""Attention implementation -> the 4D mask it takes; others (flash, flex) take the padded layout."""
MASK_FORMS.register("sdpa", _bool_mask)
MASK_FORMS.register("eager", _additive_mask)
