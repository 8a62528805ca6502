"""One line on stderr as each slow phase of a command starts, so it is never silent for long."""

from __future__ import annotations

import sys
from typing import Any


def announce(text: str) -> None:
    """``grouprl: <text>`` on stderr, flushed at once."""
    print(f"grouprl: {text}", file=sys.stderr, flush=True)


def resolved_line(config: Any) -> str:
    """The first line of a command that trains or evaluates: its config is resolved, and on what it runs."""
    return f"config resolved: model {config.model}, {data_source(config)}"


def data_source(config: Any) -> str:
    """Where the run's prompts come from, in a few words."""
    if config.env:
        return f"environment {config.env}"
    return f"dataset {config.dataset}" if config.dataset else f"task {config.task}"
