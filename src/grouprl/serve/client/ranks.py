"""Rollout servers shared by the processes of a torchrun trainer: each samples its own groups, interleaved over the
servers; process 0 alone pushes, then every process receives what the servers hold and which serve
(:meth:`Ranks.after_push`), so none samples for step t + 1 before version t is pushed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from grouprl.serve.client.servers import RolloutServerError, ServerFailure


def _said(error: BaseException | None) -> str | None:
    return None if error is None else f"{type(error).__name__}: {error}"


@dataclass(frozen=True)
class Ranks:
    """This process's place among the trainer's processes (``world`` > 1); ``group``: None for the default group."""

    rank: int
    world: int
    group: Any = field(default=None, compare=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def current(cls) -> Ranks | None:
        """The trainer's processes, or None in a run of one process."""
        if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() <= 1:
            return None
        return cls(dist.get_rank(), dist.get_world_size())

    def route(self, groups: list[int]) -> list[int]:
        """Each local group's key for the pool's round-robin: the processes' groups interleaved."""
        return [g * self.world + self.rank for g in groups]

    def _from_main(self, news: Any) -> Any:
        box = [news if self.is_main else None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def after_push(self, pool: Any, version: int | None, error: BaseException | None, again: bool = False
                   ) -> tuple[int | None, bool]:
        """Process 0's push outcome in every process (the version the servers hold, whether to push again); the
        servers it dropped are dropped here too; its error raised everywhere."""
        states = [(s.address, s.alive, s.why, s.version, s.adapter) for s in pool.servers]
        pushed, states, failed, again = self._from_main((version, states, _said(error), again))
        if self.is_main:
            if error is not None:
                raise error
            return pushed, again
        by_address = {s.address: s for s in pool.servers}
        for address, alive, why, held, adapter in states:
            if (server := by_address.get(address)) is None:
                continue
            if server.alive and not alive:  # the pool's warning names it, with process 0's reason
                pool.drop(ServerFailure(server, f"process 0 dropped it: {why}"))
            if alive:  # what it holds now: with LoRA, requests name the adapter process 0 loaded
                server.version, server.adapter = held, adapter
        if failed is not None:
            raise RolloutServerError(f"process 0 could not push the weights to the rollout servers: {failed}")
        return pushed, again
