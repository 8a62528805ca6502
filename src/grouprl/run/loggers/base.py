"""What every metrics sink shares: what it is told about the run, and a step's metrics as plain numbers."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

PROJECT = "grouprl"  # the project trackio and wandb file runs under (WANDB_PROJECT wins for wandb)


@dataclass(frozen=True)
class RunInfo:
    folder: Path
    config: dict[str, Any]
    """What config.yaml records, as plain data."""
    resumed: bool
    metrics_log: Any
    """The run's :class:`~grouprl.run.logs.JsonlLog`, which the jsonl sink writes."""

    @property
    def name(self) -> str:
        return self.folder.resolve().name


class Sink(Protocol):
    """A destination of the run's metrics, opened once per run (on its first process only)."""

    package: ClassVar[str | None]
    """The module it imports, checked for before any model loads."""
    extra: ClassVar[str | None]
    folder: ClassVar[str | None]
    """What it writes inside the run folder (removed with the run)."""

    def __init__(self, run: RunInfo) -> None: ...

    def log(self, step: int, metrics: dict[str, Any], wall_time: float) -> None:
        """A training step's or an evaluation's metrics, ``wall_time`` seconds after this start of the run."""

    def close(self) -> None: ...


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The numbers of ``metrics`` as floats; booleans, text and NaN ("not measured this step") left out.

    >>> scalars({"reward/mean": 0.5, "rollout/zero_std_groups": 2, "done": True, "note": "x", "kl": float("nan")})
    {'reward/mean': 0.5, 'rollout/zero_std_groups': 2.0}
    """
    out = {}
    for key, value in metrics.items():
        if hasattr(value, "item"):
            value = value.item()
        if isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value):
            out[key] = float(value)
    return out
