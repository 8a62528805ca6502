"""Every random choice of a run, derived from its seed and where the choice is made, never from the number of
processes or the micro-batch size: a run reproduces on a machine of another size."""

from __future__ import annotations

import torch

from grouprl.rollout.seeds import mix_seed

EVAL_STREAM = 7_777_777  # so grouprl eval draws what the trainer's evaluation drew
SHUFFLE_STREAM = 1_000


def group_seeds(base: int, first_prompt: int, num_prompts: int, group_size: int) -> list[int]:
    """Row seeds of ``num_prompts`` groups from position ``first_prompt`` of a batch: row ``p*G + g`` gets
    ``mix_seed(base, first_prompt + p, g)``, whichever process draws it.

    >>> group_seeds(7, 2, 1, 2) == [mix_seed(7, 2, 0), mix_seed(7, 2, 1)]
    True
    """
    return [mix_seed(base, first_prompt + p, g) for p in range(num_prompts) for g in range(group_size)]


def generator(*parts: int) -> torch.Generator:
    return torch.Generator().manual_seed(mix_seed(*parts))


class PromptStream:
    """An endless seeded order over ``n`` prompts, reshuffled every epoch; its position is all a resume needs."""

    def __init__(self, n: int, seed: int, position: int = 0):
        if n == 0:
            raise ValueError("the training set is empty")
        self.n, self.seed, self.position = n, seed, position

    def _epoch_order(self, epoch: int) -> list[int]:
        return torch.randperm(self.n, generator=generator(self.seed, epoch)).tolist()

    def take(self, count: int) -> list[int]:
        out: list[int] = []
        while len(out) < count:
            epoch, offset = divmod(self.position, self.n)
            grab = self._epoch_order(epoch)[offset:offset + count - len(out)]
            out.extend(grab)
            self.position += len(grab)
        return out
