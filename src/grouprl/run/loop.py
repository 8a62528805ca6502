"""The training loop every trainer shares: evaluate, ``step()`` until done (logging, evaluating and checkpointing
on schedule), evaluate, save, write ``summary.json``. The trainer (:class:`Run`) says when to stop."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Protocol

import yaml

from grouprl.errors import NonFiniteError
from grouprl.run.files import as_plain, write_text_atomic
from grouprl.run.folder import RUN_CONFIG_HEADER
from grouprl.run.health import HealthWatch
from grouprl.run.loggers import RunInfo, open_loggers
from grouprl.run.logs import JsonlLog, Progress, peak_rss_mb
from grouprl.run.signals import StopOnSignal, to_stderr


class Run(Protocol):
    config: Any
    out: Path
    run_config: Any
    """What config.yaml records."""
    metrics_log: JsonlLog
    eval_history: list[dict[str, Any]]
    step_count: int
    time_budget_s: float | None
    """Wall-clock budget, evaluations included; None = no limit."""
    setup: dict[str, Any]
    """What the run found or chose at start, for summary.json and the report."""
    is_main: bool
    """Only the first process writes config.yaml, summary.json and every sink but metrics.jsonl."""
    health: HealthWatch | None

    def step(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """(metrics, sample records for the completions log)."""

    def evaluate(self) -> dict[str, float]: ...

    def save(self) -> Path: ...

    def resume(self, spec: str) -> None:
        """Restore the checkpoint ``spec`` names (a folder, or ``latest``)."""

    def log_completions(self, records: list[dict[str, Any]], progress: Progress) -> None: ...

    def finished(self) -> bool: ...

    def eval_due(self) -> bool: ...

    def progress_bar(self) -> Progress: ...

    def agree(self, flag: bool) -> bool:
        """True if ``flag`` is true in any process, so all stop together."""


def last_eval(run: Run) -> dict[str, float]:
    """The evaluation logged at the run's current step after its last training step, if any."""
    records = run.metrics_log.records()
    trained = max((r.get("step", 0) for r in records if "loss/total" in r or "reward/mean" in r), default=0)
    found = [r for r in records if r.get("step") == run.step_count and run.step_count >= trained
             and any(k.startswith("eval/") for k in r) and "reward/mean" not in r]
    return {k: v for k, v in found[-1].items() if k.startswith("eval/")} if found else {}


def watch_health(run: Run, metrics: dict[str, Any], progress: Progress) -> str | None:
    """Add ``health/*`` to ``metrics``, print each new warning; the first active one's short form, or None."""
    if run.health is None:
        return None
    signs, active = run.health.observe(run.step_count, metrics)
    metrics.update(signs)
    for warning in run.health.new if run.is_main else ():
        if progress.bar is not None:
            progress.print(f"[yellow]step {run.step_count}: {warning}[/yellow]")
        else:
            print(f"step {run.step_count}: {warning}", flush=True)
    return active[0].split(":")[0] if active else None


def run_loop(run: Run) -> dict[str, Any]:
    """Run ``run`` until it is finished; returns the summary also written to summary.json."""
    c = run.config
    if c.resume_from:
        run.resume(c.resume_from)
    plain_config = as_plain(run.run_config)
    if run.is_main:
        write_text_atomic(run.out / "config.yaml", RUN_CONFIG_HEADER + yaml.safe_dump(plain_config, sort_keys=False))
    sinks = open_loggers(c, RunInfo(run.out, plain_config, bool(c.resume_from), run.metrics_log), run.is_main)
    start = time.perf_counter()
    stop = StopOnSignal(c.save_on_signal)

    def out_of_time() -> bool:
        budget = run.time_budget_s
        return run.agree(stop.requested or budget is not None and time.perf_counter() - start >= budget)

    def log_eval(wall_time: float | None = None) -> dict[str, float]:
        result = run.evaluate()
        if result:
            wall = time.perf_counter() - start if wall_time is None else wall_time
            sinks.log(run.step_count, result, wall)
            run.eval_history.append({"step": run.step_count, "wall_time": wall, **result})
        return result

    if run.step_count == 0:
        before = log_eval(0.0)  # the starting point of the wall-clock axis: training has not begun
    else:  # resumed: the evaluation before training was logged by the first run
        before = next((r for r in run.metrics_log.records() if r.get("step") == 0 and "eval/len_mean" in r), {})
        before = {k: v for k, v in before.items() if k.startswith("eval/")}
    progress = run.progress_bar()
    stop.install()
    try:
        while not run.finished() and not out_of_time():
            try:
                metrics, samples = run.step()
            except NonFiniteError as e:
                raise NonFiniteError(f"step {run.step_count + 1}: {e}. Training stopped; the checkpoints written so "
                                     f"far are intact (resume with --resume_from latest, with a lower lr or "
                                     f"max_grad_norm)") from e
            run.step_count += 1
            metrics["memory/peak_rss_mb"] = peak_rss_mb()
            alert = watch_health(run, metrics, progress)
            sinks.log(run.step_count, metrics, time.perf_counter() - start)
            progress.update(run.step_count, metrics, alert=alert)
            run.log_completions(samples, progress)
            if run.eval_due() and not run.finished() and not out_of_time():
                log_eval()
            if c.save_every and run.step_count % c.save_every == 0:
                run.save()
        stop.finish(run.agree(stop.requested), run.save, run.step_count, to_stderr if run.is_main else None)
    finally:
        stop.uninstall()
        progress.close()
    # A run resumed from its last step (killed after its final evaluation) already logged that evaluation.
    after = last_eval(run) if c.resume_from else {}
    after = after or log_eval()
    sinks.close()
    final = run.save()
    summary = {"steps": run.step_count, "eval_before": before, "eval_after": after, "checkpoint": str(final),
               "wall_time": time.perf_counter() - start, **({"setup": run.setup} if run.setup else {})}
    if run.is_main:
        write_text_atomic(run.out / "summary.json", json.dumps(summary, indent=2))
    return summary
