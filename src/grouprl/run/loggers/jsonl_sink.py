"""metrics.jsonl, the run folder's own log (always on): ``step`` and ``wall_time``, then the metrics."""

from __future__ import annotations

from typing import Any

from grouprl.run.loggers.base import RunInfo


class JsonlSink:
    package = extra = folder = None  # metrics.jsonl itself is the run folder's, not this sink's

    def __init__(self, run: RunInfo):
        self.log_file = run.metrics_log

    def log(self, step: int, metrics: dict[str, Any], wall_time: float) -> None:
        self.log_file.append({"step": step, "wall_time": wall_time, **metrics})

    def close(self) -> None:
        pass  # each append is written and synced as it happens
