"""Every random choice of a run, derived from its seed and where the choice is made (prompt order from
(seed, epoch), a completion's draws from (seed, step, round, prompt place, sample), a shuffle from (seed,
step, pass)), never from the number of processes or the micro-batch size: a run reproduces on a machine of
another size.
"""

from __future__ import annotations

import torch

from grouprl.rollout.seeds import mix_seed

EVAL_STREAM = 7_777_777
"""First part of every evaluation seed: evaluation draws never coincide with a training draw, and
``grouprl eval`` draws exactly what the trainer's evaluation drew."""
SHUFFLE_STREAM = 1_000
"""Minibatch shuffles use (seed, step, SHUFFLE_STREAM + pass)."""


def group_seeds(base: int, first_prompt: int, num_prompts: int, group_size: int) -> list[int]:
    """Row seeds of ``num_prompts`` groups of ``group_size`` samples, prompt-major, for the prompts
    at positions ``first_prompt ...`` of a batch drawn under seed ``base``: row ``p*G + g`` gets
    ``mix_seed(base, first_prompt + p, g)``, whichever process or chunk draws it.

    >>> group_seeds(7, 2, 1, 2) == [mix_seed(7, 2, 0), mix_seed(7, 2, 1)]
    True
    """
    return [mix_seed(base, first_prompt + p, g) for p in range(num_prompts) for g in range(group_size)]


def generator(*parts: int) -> torch.Generator:
    """A CPU generator seeded with ``mix_seed(*parts)``."""
    return torch.Generator().manual_seed(mix_seed(*parts))


class PromptStream:
    """An endless, seeded, reshuffled-every-epoch order over ``n`` prompts; its position is all the
    state a resume needs. Every process of a run walks the same stream."""

    def __init__(self, n: int, seed: int, position: int = 0):
        if n == 0:
            raise ValueError("the training set is empty")
        self.n, self.seed, self.position = n, seed, position

    def _epoch_order(self, epoch: int) -> list[int]:
        return torch.randperm(self.n, generator=generator(self.seed, epoch)).tolist()

    def take(self, count: int) -> list[int]:
        """The next ``count`` prompt indices (crossing into the next epoch's order when needed)."""
        out: list[int] = []
        while len(out) < count:
            epoch, offset = divmod(self.position, self.n)
            grab = self._epoch_order(epoch)[offset:offset + count - len(out)]
            out.extend(grab)
            self.position += len(grab)
        return out
