"""Weights & Biases, files in the run folder's ``wandb/`` (``WANDB_MODE=offline`` needs no account); a resumed
run continues the wandb run the folder's last start made."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from grouprl.run.loggers.base import PROJECT, RunInfo, scalars


def previous_id(folder: Path) -> str | None:
    """The id of the wandb run ``folder`` last held (``latest-run`` points at ``run-<date>_<time>-<id>``)."""
    latest = folder / "latest-run"
    if not latest.is_symlink():
        return None
    return os.readlink(latest).rstrip("/").rsplit("-", 1)[-1] or None


class WandbSink:
    package = extra = folder = "wandb"

    def __init__(self, run: RunInfo):
        import wandb

        resume_id = previous_id(run.folder / self.folder) if run.resumed else None
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or PROJECT, name=run.name,
                              dir=str(run.folder), config=run.config, id=resume_id,
                              resume="allow" if resume_id else None)

    def log(self, step: int, metrics: dict[str, Any], wall_time: float) -> None:
        self.run.log(scalars(metrics), step=step)

    def close(self) -> None:
        self.run.finish()
