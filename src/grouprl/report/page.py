"""Plots and a static HTML report from a run folder, still going or killed: :func:`write_report` writes
``report/*.png`` and ``report/report.html``, :func:`summarize` gives the headline numbers."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from grouprl.report.data import ema, is_number, iter_jsonl, metric_keys, read_jsonl, series
from grouprl.report.html import Plot, StepSamples, render_html
from grouprl.report.plots import write_plots
from grouprl.run.files import write_text_atomic
from grouprl.run.health import replay

METRICS_FILE = "metrics.jsonl"
COMPLETIONS_FILE = "completions.jsonl"
CONFIG_FILE = "config.yaml"
SUMMARY_FILE = "summary.json"
REPORT_DIR = "report"
BEST_IS_MAX = ("reward/mean", "eval/accuracy", "eval/mean_reward")


def _eval_at_ends(records: list[dict[str, Any]]) -> tuple[dict[str, float] | None, dict[str, float] | None]:
    """Evaluation at step 0 (before training, if logged) and at the last evaluated step."""
    evals: dict[float, dict[str, float]] = {}
    for r in records:
        found = {k[len("eval/"):]: float(v) for k, v in r.items() if k.startswith("eval/") and is_number(v)}
        if found and is_number(r.get("step")):
            evals.setdefault(r["step"], {}).update(found)
    if not evals:
        return None, None
    first, last = min(evals), max(evals)
    before = evals[first] if first == 0 else None
    after = evals[last] if last != 0 else None
    return before, after


def _strip_eval(d: Any) -> dict[str, Any] | None:
    if not isinstance(d, dict):
        return None
    return {k.removeprefix("eval/"): v for k, v in d.items()}


def summarize(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The run's headline numbers: steps, wall time, final and best metrics, evaluation before and after training."""
    run_dir = _existing_dir(run_dir)
    records = read_jsonl(run_dir / METRICS_FILE)
    keys = metric_keys(records)
    final, best = {}, {}
    for key in keys:
        steps, values = series(records, key)
        final[key] = values[-1]
        if key in BEST_IS_MAX or key.startswith("eval/pass@"):
            i = max(range(len(values)), key=values.__getitem__)
            best[key] = {"step": steps[i], "value": values[i]}
    steps = [r["step"] for r in records if is_number(r.get("step"))]
    walls = [r["wall_time"] for r in records if is_number(r.get("wall_time"))]
    run_summary = _read_json(run_dir / SUMMARY_FILE)
    before, after = _eval_at_ends(records)
    source = "metrics.jsonl" if before or after else None
    if "eval_before" in run_summary or "eval_after" in run_summary:
        before, after = _strip_eval(run_summary.get("eval_before")), _strip_eval(run_summary.get("eval_after"))
        source = SUMMARY_FILE
    _, rewards = series(records, "reward/mean")
    _, step_times = series(records, "time/step")
    return {
        "run_dir": str(run_dir),
        "name": run_dir.resolve().name,
        "num_records": len(records),
        "last_step": max(steps) if steps else None,
        "wall_time_s": max(walls) if walls else None,
        "final": final,
        "best": best,
        "reward_smoothed_final": ema(rewards)[-1] if rewards else None,
        "mean_step_time_s": sum(step_times) / len(step_times) if step_times else None,
        "eval_before": before,
        "eval_after": after,
        "eval_source": source,
        "run_summary": {k: v for k, v in run_summary.items() if k not in ("eval_before", "eval_after")},
        # the early-warning signs, by the rules the run itself applied (none for classic control)
        "health": replay(records) if any("health/warnings" in r for r in records) else None,
    }


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}  # absent until the run ends; half-written if it was killed while writing
    return data if isinstance(data, dict) else {}


def _existing_dir(run_dir: str | os.PathLike) -> Path:
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"Run folder {path} does not exist (expected the folder a training run wrote).")
    return path


def sample_steps(path: Path, how_many: int = 3) -> list[int]:
    """First, middle and last steps that have logged completions (fewer if fewer exist)."""
    steps = sorted({r["step"] for r in iter_jsonl(path) if is_number(r.get("step"))})
    if len(steps) <= how_many:
        return steps
    picks = [steps[round(i * (len(steps) - 1) / (how_many - 1))] for i in range(how_many)]
    return sorted(set(picks))


def read_samples(path: Path, steps: list[int], max_rows: int = 24) -> list[StepSamples]:
    """Up to ``max_rows`` completions for each of ``steps``, in logged order, streamed from the file."""
    rows: dict[int, list[dict[str, Any]]] = {s: [] for s in steps}
    counts, sums, scored = dict.fromkeys(steps, 0), dict.fromkeys(steps, 0.0), dict.fromkeys(steps, 0)
    for r in iter_jsonl(path):
        step = r.get("step")
        if step in rows:
            counts[step] += 1
            if is_number(r.get("reward")):
                sums[step] += r["reward"]
                scored[step] += 1
            if len(rows[step]) < max_rows:
                rows[step].append(r)
    return [StepSamples(s, rows[s], counts[s], sums[s] / scored[s] if scored[s] else None) for s in steps]


PLOT_CAPTIONS = {
    "reward.png": "Mean reward of the sampled completions at each step, in total and per reward function.",
    "accuracy.png": "Held-out evaluation; step 0 is the model before training.",
    "zero_std.png": "A group whose completions all get the same reward has zero advantage, so it contributes no "
                    "gradient. Near 1, the task is too easy or too hard for the current policy.",
    "kl.png": "How far the policy has moved from the reference model (the penalty beta weighs). Steady growth is "
              "expected; a sudden jump signals an unstable update.",
    "entropy.png": "Mean entropy of the next-token distribution over completion tokens. A fast collapse towards "
                   "0 means the policy stops exploring.",
    "length.png": "Completion lengths in tokens and the fraction cut off at max_new_tokens (those rarely earn "
                  "reward; a rising fraction calls for a larger limit).",
    "clip.png": "Fraction of tokens whose probability ratio hit the clip range. Near 0: the update is gentle "
                "(or steps are on-policy); above ~0.2: the learning rate is likely too high.",
    "time.png": "Wall-clock seconds per step, split into generation (rollout), reward scoring, log-prob "
                "computation and the gradient update.",
    "loss.png": "The loss terms as optimised. GRPO's policy loss is not a progress measure (advantages are "
                "centred per group); watch reward and accuracy instead.",
    "optim.png": "Gradient norm and learning-rate schedule.",
}


def write_report(run_dir: str | os.PathLike, *, max_samples_per_step: int = 24) -> Path:
    """Write ``run_dir/report/`` (PNG plots and ``report.html``) and return the HTML file's path."""
    run_dir = _existing_dir(run_dir)
    out_dir = run_dir / REPORT_DIR
    records = read_jsonl(run_dir / METRICS_FILE)
    names = write_plots(records, out_dir)
    summary = summarize(run_dir)
    completions = run_dir / COMPLETIONS_FILE
    samples = read_samples(completions, sample_steps(completions), max_samples_per_step)
    config_path = run_dir / CONFIG_FILE
    config_text = config_path.read_text(encoding="utf-8", errors="replace") if config_path.exists() else None
    links = [(f"../{name}", name) for name in (METRICS_FILE, COMPLETIONS_FILE, CONFIG_FILE, SUMMARY_FILE)
             if (run_dir / name).exists()]
    plots = [Plot(name, PLOT_CAPTIONS[name]) for name in names]
    html_path = out_dir / "report.html"
    write_text_atomic(html_path, render_html(summary, plots, samples, config_text, links))
    return html_path
