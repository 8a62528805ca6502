"""trackio (Hugging Face's local-first tracker): runs named after the run folder go to its local store
(``TRACKIO_DIR``); a resumed run continues the latest trackio run of that name."""

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
