"""The process group's interface in one process, every method the identity (``dist.processes`` is the same over
torch.distributed)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from grouprl.run import checkpoint_files as ckpt


class OneProcess:
    """The whole batch in this process."""

    rank = 0
    world_size = 1
    is_main = True  # only the main process writes the run folder's logs, summary and report
    device: torch.device | None = None  # where place() puts the models (None: where they already are)

    def place(self, policy: nn.Module, reference: nn.Module | None) -> tuple[nn.Module, nn.Module | None]:
        """The models as this process trains them (sharded or wrapped across processes)."""
        return policy, reference

    def forward_model(self, model: nn.Module) -> nn.Module:
        """The module the log-prob passes call (across processes: one whole forward, so the sharding's hooks fire)."""
        return model

    def share(self, count: int) -> tuple[int, int]:
        """(first, stop) of this process's slice of ``count`` prompts or held-out rows."""
        return 0, count

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def gather(self, obj: Any) -> list[Any]:
        return [obj]

    def check(self, error: BaseException | None) -> None:
        """Every process calls this at the same point with what it caught: if any failed, all raise."""
        if error is not None:
            raise error

    def any(self, flag: bool) -> bool:
        """True when ``flag`` is true in some process (so all stop after the same step)."""
        return flag

    def loss_scale(self) -> float:
        """Factor on each process's loss so the reduced gradient is the whole batch's."""
        return 1.0

    @contextlib.contextmanager
    def rollout(self, sampler: Any, policy: nn.Module, ahead: bool = False) -> Iterator[None]:
        yield

    def combine(self, metrics: dict[str, float], tokens: float) -> dict[str, float]:
        """One metrics record for the run from this process's (weighted by its ``tokens``)."""
        return metrics

    def save(self, root: Path, step: int, **parts: Any) -> Path:
        """Checkpoint ``step`` (see :func:`grouprl.run.checkpoint_files.save_checkpoint` for ``parts``)."""
        return ckpt.save_checkpoint(root, step, **parts)

    def load(self, folder: Path, **parts: Any) -> dict[str, Any]:
        return ckpt.load_checkpoint(folder, **parts)
