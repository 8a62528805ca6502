"""trackio (Hugging Face's local-first tracker): runs go to its local store (``TRACKIO_DIR``, by
default ``~/.cache/huggingface/trackio``), under project :data:`~grouprl.run.loggers.base.PROJECT`, named
after the run folder; ``trackio show`` opens the dashboard. A resumed run continues the latest trackio
run of that name. trackio's own settings apply (``TRACKIO_SPACE_ID`` logs to a Hugging Face Space)."""

from __future__ import annotations

from typing import Any

from grouprl.run.loggers.base import PROJECT, RunInfo, scalars


class TrackioSink:
    package = extra = "trackio"
    folder = None

    def __init__(self, run: RunInfo):
        import trackio

        self.run = trackio.init(project=PROJECT, name=run.name, config=run.config,
                                resume="allow" if run.resumed else "never")

    def log(self, step: int, metrics: dict[str, Any], wall_time: float) -> None:
        self.run.log(scalars(metrics), step=step)

    def close(self) -> None:
        self.run.finish()
