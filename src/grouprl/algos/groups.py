"""Which rows are compared with which, and reductions within groups: :class:`Contiguous` (G consecutive rows,
B = P * G, a ``view(P, G)``) or :class:`ByIds` (any partition by ``[B]`` ids, scatters). Both give every row
its group's value (``[B] -> [B]``); groups are numbered in order of first appearance."""

from __future__ import annotations

import torch


def _check_rewards(rewards: torch.Tensor) -> None:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")


class Contiguous:
    """Groups of ``group_size`` consecutive rows."""

    def __init__(self, batch_size: int, group_size: int):
        if group_size < 2:
            raise ValueError(
                f"group_size must be >= 2, got {group_size}: a group-relative advantage compares several "
                "completions of the same prompt, and a group of one always gets advantage 0"
            )
        if batch_size % group_size:
            raise ValueError(
                f"batch of {batch_size} rewards does not split into whole groups of {group_size}; "
                "make the number of rows a multiple of the group size"
            )
        self.g, self.count = group_size, batch_size // group_size

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(self.count, self.g)  # [B] -> [P, G]

    def total(self, x: torch.Tensor) -> torch.Tensor:
        """``[B]``: each row's group sum of ``x [B]``."""
        return self._rows(x).sum(-1, keepdim=True).expand(-1, self.g).reshape(-1)

    def amax(self, x: torch.Tensor) -> torch.Tensor:
        return self._rows(x).amax(-1, keepdim=True).expand(-1, self.g).reshape(-1)

    def amin(self, x: torch.Tensor) -> torch.Tensor:
        return self._rows(x).amin(-1, keepdim=True).expand(-1, self.g).reshape(-1)

    def below_minus_above(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """``[B]``: how many valid rows of the group have a smaller ``x`` minus how many a larger."""
        r, v = self._rows(x), self._rows(valid)
        cmp = torch.sign(r.unsqueeze(-1) - r.unsqueeze(-2)) * v.unsqueeze(-2)  # [P, G, G]: sign(x_i - x_j), valid j
        return cmp.sum(-1).reshape(-1)

    def per_group(self, x: torch.Tensor) -> torch.Tensor:
        """``[P]``: the value of each group from a per-row ``x [B]`` that is constant within groups."""
        return self._rows(x)[:, 0]


class ByIds:
    """Groups given by ``group_ids [B]`` (any integers; equal ids form a group)."""

    def __init__(self, group_ids: torch.Tensor):
        if group_ids.dim() != 1:
            raise ValueError(f"group_ids must be 1-D [B], got shape {tuple(group_ids.shape)}")
        _, first = torch.unique(group_ids, return_inverse=True)
        # Renumber 0..P-1 in order of first appearance.
        order = torch.full((int(first.max()) + 1 if len(first) else 0,), len(first), dtype=torch.long)
        order = order.scatter_reduce(0, first, torch.arange(len(first)), "amin")
        rank = torch.empty_like(order)
        rank[order.argsort()] = torch.arange(len(order))
        self.index = rank[first]  # [B] in 0..P-1
        self.count = len(order)

    def _scatter(self, x: torch.Tensor, how: str) -> torch.Tensor:
        init = {"sum": 0.0, "amax": -torch.inf, "amin": torch.inf}[how]
        out = torch.full((self.count,), init, dtype=x.dtype)
        return out.scatter_reduce(0, self.index, x, how, include_self=how == "sum")[self.index]

    def total(self, x: torch.Tensor) -> torch.Tensor:
        return self._scatter(x, "sum")

    def amax(self, x: torch.Tensor) -> torch.Tensor:
        return self._scatter(x, "amax")

    def amin(self, x: torch.Tensor) -> torch.Tensor:
        return self._scatter(x, "amin")

    def below_minus_above(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        same = (self.index.unsqueeze(-1) == self.index.unsqueeze(-2)).to(x.dtype)  # [B, B]
        return (torch.sign(x.unsqueeze(-1) - x.unsqueeze(-2)) * same * valid.unsqueeze(-2)).sum(-1)

    def per_group(self, x: torch.Tensor) -> torch.Tensor:
        first = torch.full((self.count,), len(self.index), dtype=torch.long)
        first = first.scatter_reduce(0, self.index, torch.arange(len(self.index)), "amin")  # [P] first row
        return x[first]


Groups = Contiguous | ByIds


def make_groups(rewards: torch.Tensor, group_size: int | None = None,
                group_ids: torch.Tensor | None = None) -> Groups:
    """The grouping of ``rewards [B]``: contiguous groups of ``group_size``, or by ``group_ids [B]``."""
    _check_rewards(rewards)
    if group_ids is not None:
        if group_ids.shape != rewards.shape:
            raise ValueError(f"group_ids {tuple(group_ids.shape)} must match rewards {tuple(rewards.shape)}")
        return ByIds(group_ids.to(torch.long).cpu())
    if group_size is None:
        raise ValueError("give group_size (equal contiguous groups) or group_ids (any grouping)")
    return Contiguous(rewards.numel(), group_size)
