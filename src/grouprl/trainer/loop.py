"""The training loop every trainer shares, language-model or classic-control: evaluate before,
``step()`` until done (logging each step's metrics, evaluating and checkpointing on schedule),
evaluate after, save, write ``summary.json``.

A trainer sets ``config`` (with ``resume_from``, ``tensorboard``, ``progress``, ``eval_every``,
``save_every``), ``out`` (the run folder), ``run_config``, ``metrics_log``, ``eval_history`` and
``step_count``, and implements :meth:`TrainLoop.step`, :meth:`~TrainLoop.evaluate`,
:meth:`~TrainLoop.save` and :meth:`~TrainLoop.resume`. When the loop stops and when it evaluates
are hooks, so a trainer whose budget is counted in environment steps reuses it unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import yaml

from grouprl.trainer.metrics import JsonlLog, Progress, TensorBoardSink, peak_rss_mb, write_text_atomic


class TrainLoop:
    """The loop around ``step()``; see the module docstring for what a subclass provides."""

    config: Any
    out: Path
    run_config: Any
    metrics_log: JsonlLog
    eval_history: list[dict[str, Any]]
    step_count: int
    time_budget_s: float | None = None
    """Wall-clock budget of :meth:`train` (from its start, evaluations included); None = no limit.
    Set on the instance, e.g. by ``grouprl compare`` to give every algorithm the same time."""
    is_main: bool = True
    """False in every process of a multi-process run but the first: only the first writes the run
    folder's config.yaml, TensorBoard events and summary.json."""

    # -- hooks ------------------------------------------------------------------------------------
    def step(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """One training iteration: (metrics, sample records for the completions log)."""
        raise NotImplementedError

    def evaluate(self) -> dict[str, float]:
        return {}

    def save(self) -> Path:
        raise NotImplementedError

    def resume(self, spec: str) -> None:
        raise NotImplementedError

    def log_completions(self, records: list[dict[str, Any]], progress: Progress) -> None:
        pass

    def finished(self) -> bool:
        """True once the training budget is spent."""
        return self.step_count >= self.config.total_steps

    def eval_due(self) -> bool:
        """Evaluate after this step (the final evaluation is separate)?"""
        every = self.config.eval_every
        return bool(every) and self.step_count % every == 0

    def progress_bar(self) -> Progress:
        return Progress(self.config.total_steps, self.step_count, self.config.progress)

    # -- the loop ---------------------------------------------------------------------------------
    def _out_of_time(self, start: float) -> bool:
        return self.time_budget_s is not None and time.perf_counter() - start >= self.time_budget_s

    def _log_eval(self, wall: float) -> dict[str, float]:
        result = self.evaluate()
        if result:
            record = {"step": self.step_count, "wall_time": wall, **result}
            self.metrics_log.append(record)
            self.eval_history.append(record)
        return result

    def train(self) -> dict[str, Any]:
        """Run until :meth:`finished` (from a checkpoint if ``resume_from``), evaluating before, when
        :meth:`eval_due` and at the end; returns the summary also written to summary.json."""
        c = self.config
        if c.resume_from:
            self.resume(c.resume_from)
        if self.is_main:
            write_text_atomic(self.out / "config.yaml", yaml.safe_dump(as_plain(self.run_config), sort_keys=False))
        tb = TensorBoardSink(self.out / "tensorboard", c.tensorboard and self.is_main)
        start = time.perf_counter()
        if self.step_count == 0:
            before = self._log_eval(0.0)
        else:  # resumed: the evaluation before training was logged by the first run
            before = next((r for r in self.metrics_log.records() if r.get("step") == 0 and "eval/len_mean" in r), {})
            before = {k: v for k, v in before.items() if k.startswith("eval/")}
        progress = self.progress_bar()
        try:
            while not self.finished() and not self._out_of_time(start):
                metrics, samples = self.step()
                self.step_count += 1
                metrics["memory/peak_rss_mb"] = peak_rss_mb()
                record = {"step": self.step_count, "wall_time": time.perf_counter() - start, **metrics}
                self.metrics_log.append(record)
                tb.log(metrics, self.step_count)
                progress.update(self.step_count, metrics)
                self.log_completions(samples, progress)
                if self.eval_due() and not self.finished() and not self._out_of_time(start):
                    tb.log(self._log_eval(time.perf_counter() - start), self.step_count)
                if c.save_every and self.step_count % c.save_every == 0:
                    self.save()
        finally:
            progress.close()
        after = self._log_eval(time.perf_counter() - start)
        tb.log(after, self.step_count)
        tb.close()
        final = self.save()
        summary = {"steps": self.step_count, "eval_before": before, "eval_after": after,
                   "checkpoint": str(final), "wall_time": time.perf_counter() - start}
        if self.is_main:
            write_text_atomic(self.out / "summary.json", json.dumps(summary, indent=2))
        return summary


def as_plain(config: Any) -> dict[str, Any]:
    """A (possibly nested) dataclass as plain YAML/JSON-able data (tuples become lists)."""

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, list | tuple):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(config)
