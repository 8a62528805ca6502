"""Where a run's metrics go: sinks chosen by the ``loggers`` key, each importing its package only when opened."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

from grouprl.registry import Registry, UnknownNameError
from grouprl.run.loggers.base import RunInfo, Sink
from grouprl.run.loggers.jsonl_sink import JsonlSink
from grouprl.run.loggers.tensorboard_sink import TensorBoardSink
from grouprl.run.loggers.trackio_sink import TrackioSink
from grouprl.run.loggers.wandb_sink import WandbSink

LOGGERS: Registry[type[Sink]] = Registry("logger")
LOGGERS.register("jsonl", JsonlSink)
LOGGERS.register("tensorboard", TensorBoardSink)
LOGGERS.register("trackio", TrackioSink)
LOGGERS.register("wandb", WandbSink)


def installed(package: str | None) -> bool:
    return package is None or importlib.util.find_spec(package) is not None


def logger_problems(loggers: Sequence[str], tensorboard: bool | None = None) -> list[str]:
    """What is wrong with the ``loggers`` key, one sentence each; nothing is imported."""
    out = []
    for name in loggers:
        try:
            sink = LOGGERS.get(name)
        except UnknownNameError as e:
            out.append(f"loggers: {e}")
            continue
        if not installed(sink.package):
            out.append(f"loggers: {name} needs the {sink.package} package, which is not installed: "
                       f"pip install 'grouprl[{sink.extra}]'")
    if "tensorboard" in loggers and tensorboard is False:  # None: a config without the older switch
        out.append("loggers names tensorboard but tensorboard is false: drop one of the two")
    return out


def chosen(loggers: Sequence[str], tensorboard: bool = False) -> list[str]:
    """jsonl, then ``loggers``, then tensorboard when ``tensorboard`` is true and installed."""
    names = ["jsonl", *loggers]
    if tensorboard and installed(TensorBoardSink.package):
        names.append("tensorboard")
    return list(dict.fromkeys(names))


def run_folders() -> tuple[str, ...]:
    """What sinks write inside a run folder (a run's own files: ``overwrite`` removes them)."""
    return tuple(sorted({LOGGERS.get(n).folder for n in LOGGERS} - {None}))


class Loggers:
    def __init__(self, sinks: Sequence[Sink]):
        self.sinks = list(sinks)

    def log(self, step: int, metrics: dict[str, Any], wall_time: float) -> None:
        for sink in self.sinks:
            sink.log(step, metrics, wall_time)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def open_loggers(config: Any, run: RunInfo, is_main: bool = True) -> Loggers:
    """The sinks ``config`` chooses, opened for ``run``; a process other than the first opens only jsonl."""
    # classic control keeps the older tensorboard switch; the trainer's config retired it (loggers names it)
    names = chosen(config.loggers, getattr(config, "tensorboard", False)) if is_main else ["jsonl"]
    return Loggers([LOGGERS.get(name)(run) for name in names])


__all__ = ["LOGGERS", "Loggers", "RunInfo", "Sink", "chosen", "installed", "logger_problems", "open_loggers",
           "run_folders"]
