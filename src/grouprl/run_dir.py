"""A run folder: what a run writes into it, and the rule that a new run never mixes into an
earlier one (its metrics log would be appended to, and every table and plot read from it would
blend the two runs)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from grouprl.config import ConfigError

RUN_FILES = ("metrics.jsonl", "completions.jsonl", "summary.json", "config.yaml")
RUN_DIRS = ("checkpoints", "report", "tensorboard")


def holds_run(folder: str | Path) -> bool:
    """Whether ``folder`` holds an earlier run's log or checkpoints."""
    out = Path(folder)
    return (out / "metrics.jsonl").exists() or (out / "checkpoints").exists()


def prepare_output_dir(folder: str | Path, *, resume_from: str | None = None, overwrite: bool = False,
                       echo: Callable[[str], None] = print) -> None:
    """Refuse to start a run in ``folder`` when it holds an earlier one, unless resuming it; with
    ``overwrite``, remove that run's files (only those) first."""
    out = Path(folder)
    if resume_from or not holds_run(out):
        return
    if not overwrite:
        raise ConfigError(f"output_dir {str(out)!r} already holds a run; continue it with --resume_from latest, "
                          "replace it with --overwrite, or choose another --output_dir")
    echo(f"replacing the earlier run in {out}")
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
    for name in RUN_DIRS:
        shutil.rmtree(out / name, ignore_errors=True)
