"""One seed from several integers: the mixer every layer uses (run folders, the rollout engines), kept at
the bottom so the engines below the run layer derive their per-turn seeds the same way."""

from __future__ import annotations

MODULUS = 2**62
"""Seeds stay below this (torch generators take any 64-bit value)."""


def mix_seed(*parts: int) -> int:
    """One seed from several integers, e.g. (seed, step, round): a polynomial hash, so (1, 2) and
    (2, 1) differ and a resumed run derives the same seeds as an uninterrupted one.

    >>> mix_seed(3, 5) == 3 * 1_000_003 + 5, mix_seed(3, 5) != mix_seed(5, 3)
    (True, True)
    """
    out = 0
    for p in parts:
        out = (out * 1_000_003 + int(p)) % MODULUS
    return out
