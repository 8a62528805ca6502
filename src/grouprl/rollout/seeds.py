"""Seeds of rollouts: one seed from several integers, and the row seeds a ``generate`` call samples with. A
completion's randomness depends on its own seed only, never on what else is in the batch."""

from __future__ import annotations

from collections.abc import Sequence

import torch

MODULUS = 2**62


def mix_seed(*parts: int) -> int:
    """One seed from several integers, e.g. (seed, step, round), by a polynomial hash: order matters.

    >>> mix_seed(3, 5) == 3 * 1_000_003 + 5, mix_seed(3, 5) != mix_seed(5, 3)
    (True, True)
    """
    out = 0
    for p in parts:
        out = (out * 1_000_003 + int(p)) % MODULUS
    return out


def resolve_row_seeds(seed: int | Sequence[int] | None, rows: int) -> list[int]:
    """``rows`` row seeds from the seeds themselves, one int that seeds their draw, or None (fresh randomness)."""
    if seed is not None and not isinstance(seed, int):
        seeds = [int(s) for s in seed]
        if len(seeds) != rows:
            raise ValueError(f"{len(seeds)} row seeds for {rows} rows (P prompts x G samples)")
        return seeds
    gen = torch.Generator()
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return torch.randint(0, MODULUS, (rows,), generator=gen).tolist()
