"""Reading a run's JSON-lines logs, tolerating a run still going or killed: records, one metric's (steps,
values), the metric names, and the moving average the plots and summaries smooth with."""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """JSON objects of a JSON-lines file; a line that does not parse is skipped, the last silently (a run killed
    mid-write leaves half a line), any other with a warning."""
    if not path.exists():
        return
    pending_bad = None
    with path.open(encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            if pending_bad is not None:  # a bad line with more after it is damage, not a cut-off end
                warnings.warn(f"{path}:{pending_bad}: skipped a line that is not valid JSON", stacklevel=2)
                pending_bad = None
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                pending_bad = lineno
                continue
            if isinstance(record, dict):
                yield record


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return list(iter_jsonl(Path(path)))


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one metric, sorted by step; a step logged twice (by a resumed run) keeps the later value."""
    by_step: dict[float, float] = {}
    for record in records:
        step, value = record.get("step"), record.get(key)
        if is_number(step) and is_number(value):
            by_step[step] = float(value)
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def metric_keys(records: list[dict[str, Any]]) -> list[str]:
    """Every key with at least one finite numeric value, except step and wall_time."""
    keys = {k for r in records for k, v in r.items() if is_number(v)}
    return sorted(keys - {"step", "wall_time"})


def ema(values: list[float], span: float | None = None) -> list[float]:
    """Exponential moving average with alpha = 2 / (span + 1), started at the first value; the default span, a
    tenth of the points (at least 2), shows the trend at any run length."""
    if not values:
        return []
    alpha = 2.0 / ((span or max(2.0, len(values) / 10)) + 1.0)
    out = [values[0]]
    for v in values[1:]:
        out.append(out[-1] + alpha * (v - out[-1]))
    return out
