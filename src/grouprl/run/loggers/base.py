"""What every metrics sink shares: what it is told about the run, what it is given each time, and
how it turns a step's metrics into the plain numbers trackers take."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

PROJECT = "grouprl"
"""The project trackio and wandb file runs under (wandb: WANDB_PROJECT, when set, wins); each run is
named after its run folder."""


@dataclass(frozen=True)
class RunInfo:
    """What a sink is told about the run when it opens."""

    folder: Path
    """The run folder (it exists)."""
    config: dict[str, Any]
    """What the folder's config.yaml records, as plain data."""
    resumed: bool
    """The run continues from a checkpoint of an earlier start in the same folder."""
    metrics_log: Any
    """The run's metrics.jsonl (:class:`~grouprl.run.logs.JsonlLog`), which the jsonl sink writes."""

    @property
    def name(self) -> str:
        return self.folder.resolve().name


class Sink(Protocol):
    """A destination of the run's metrics, opened once per run (on its first process only)."""

    package: ClassVar[str | None]
    """The module it imports, checked for before any model loads (None: nothing beyond grouprl's own)."""
    extra: ClassVar[str | None]
    """grouprl's pip extra that installs ``package``."""
    folder: ClassVar[str | None]
    """What it writes inside the run folder (None: nothing): a run's own files, removed with it."""

    def __init__(self, run: RunInfo) -> None: ...

    def log(self, step: int, metrics: dict[str, Any], wall_time: float) -> None:
        """One record: a training step's metrics or an evaluation's, at ``step``, ``wall_time``
        seconds after the run (this start of it) began."""

    def close(self) -> None:
        """Flush and release; called once, after the last record."""


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The numbers of ``metrics`` as floats (0-d tensors included; booleans, text and NaN left out: a
    NaN is written to metrics.jsonl as null and means "not measured this step").

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
