"""TensorBoard event files in the run folder's ``tensorboard/``: ``tensorboard --logdir RUN_FOLDER``."""

from __future__ import annotations

from typing import Any

from grouprl.run.loggers.base import RunInfo, scalars


class TensorBoardSink:
    package = extra = folder = "tensorboard"

    def __init__(self, run: RunInfo):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run.folder / self.folder))

    def log(self, step: int, metrics: dict[str, Any], wall_time: float) -> None:
        for key, value in scalars(metrics).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
