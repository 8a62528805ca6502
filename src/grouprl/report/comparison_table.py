"""The table and plots of ``grouprl compare``, read from the run folders it trained; seeds of one algorithm are
averaged in the table and drawn as thin lines of one colour."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from grouprl.report.data import ema, read_jsonl, series
from grouprl.report.plots import COLORS


def _eval_key(records: list[dict[str, Any]]) -> str:
    return "eval/accuracy" if any("eval/accuracy" in r for r in records) else "eval/mean_reward"


def _xy(records: list[dict[str, Any]], key: str, x: str) -> tuple[list[float], list[float]]:
    """(x, value) pairs of ``key`` over the records that have both, in step order."""
    pairs = sorted((r["step"], r[x], r[key]) for r in records
                   if isinstance(r.get(key), int | float) and isinstance(r.get(x), int | float) and "step" in r)
    return [p[1] for p in pairs], [p[2] for p in pairs]


def summarize_run(algo: str, seed: int, folder: Path, control: bool) -> dict[str, Any]:
    """The numbers and curves of one run folder."""
    records = read_jsonl(folder / "metrics.jsonl")
    summary = json.loads((folder / "summary.json").read_text()) if (folder / "summary.json").exists() else {}
    key = _eval_key(records)
    x = "eval/env_steps" if control else "step"
    evals = [r for r in records if key in r]
    train = [r for r in records if "time/step" in r]
    rate_key = "throughput/env_steps_per_s" if control else "throughput/tokens_per_s"

    def mean_of(k: str) -> float | None:
        values = [r[k] for r in train if isinstance(r.get(k), int | float)]
        return statistics.fmean(values) if values else None

    _, rewards = series(records, "reward/mean")
    tail = rewards[-max(1, len(rewards) // 10):] if rewards else []
    out = {
        "algo": algo, "seed": seed, "run_dir": str(folder), "eval_key": key,
        "eval_before": evals[0][key] if evals and evals[0].get("step") == 0 else None,
        "eval_after": evals[-1][key] if evals else None, "eval_best": max((r[key] for r in evals), default=None),
        "reward_final": statistics.fmean(tail) if tail else None, "wall_time_s": summary.get("wall_time"),
        "step_time_s": mean_of("time/step"), "throughput": mean_of(rate_key),
        "peak_rss_mb": max((r["memory/peak_rss_mb"] for r in train if "memory/peak_rss_mb" in r), default=None),
        "kl_final": next((r["policy/kl"] for r in reversed(train) if isinstance(r.get("policy/kl"), int | float)),
                         None),
        "steps": summary.get("steps"),
        "curves": {"eval_x": _xy(records, key, x), "eval_wall": _xy(records, key, "wall_time"),
                   "reward_x": _xy(records, "reward/mean", "rollout/env_steps" if control else "step"),
                   "reward_wall": _xy(records, "reward/mean", "wall_time"),
                   "kl_x": _xy(records, "policy/kl", "rollout/env_steps" if control else "step")},
    }
    if control:
        solved = summary.get("solved_at_env_steps")
        out["solved_at"] = solved
        out["env_steps"] = summary.get("env_steps")
        out["wall_to_solve_s"] = next((r["wall_time"] for r in evals if r.get("eval/env_steps") == solved), None) \
            if solved is not None else None
    return out


def summarize_runs(jobs: list[tuple[str, int, Path]], control: bool) -> list[dict[str, Any]]:
    return [summarize_run(algo, seed, folder, control) for algo, seed, folder in jobs]


def _fmt(values: list[float | None], digits: int) -> str:
    """Mean of the known values, with +- the (population) spread when there are several."""
    known = [v for v in values if v is not None and math.isfinite(v)]
    if not known:
        return "-"
    mean = statistics.fmean(known)
    spread = f" ± {statistics.pstdev(known):.{digits}f}" if len(known) > 1 else ""
    missing = f" ({len(values) - len(known)} n/a)" if len(known) < len(values) else ""
    return f"{mean:.{digits}f}{spread}{missing}"


LM_COLUMNS = [("eval before", "eval_before", 3), ("eval after", "eval_after", 3), ("eval best", "eval_best", 3),
              ("train reward (last 10%)", "reward_final", 3), ("wall time (s)", "wall_time_s", 0),
              ("s / step", "step_time_s", 2), ("tokens / s", "throughput", 0), ("peak RSS (MiB)", "peak_rss_mb", 0),
              ("KL to ref (final)", "kl_final", 4)]
CONTROL_COLUMNS = [("env steps to solve", "solved_at", 0), ("wall time to solve (s)", "wall_to_solve_s", 1),
                   ("final eval return", "eval_after", 1), ("env steps run", "env_steps", 0),
                   ("wall time (s)", "wall_time_s", 1), ("env steps / s", "throughput", 0),
                   ("peak RSS (MiB)", "peak_rss_mb", 0), ("KL to π0 (final)", "kl_final", 3)]


def comparison_table(runs: list[dict[str, Any]], control: bool) -> str:
    """A markdown table, one row per algorithm (mean ± spread over its seeds)."""
    columns = CONTROL_COLUMNS if control else LM_COLUMNS
    algos = list(dict.fromkeys(r["algo"] for r in runs))
    key = runs[0]["eval_key"] if runs else "eval"
    lines = [f"| algorithm | seeds | {' | '.join(name for name, _, _ in columns)} |",
             "|---|---|" + "---|" * len(columns)]
    for algo in algos:
        mine = [r for r in runs if r["algo"] == algo]
        cells = [_fmt([r.get(field) for r in mine], digits) for _, field, digits in columns]
        lines.append(f"| {algo} | {len(mine)} | {' | '.join(cells)} |")
    note = (f"\n\n`eval` is `{key}` on the held-out set; steps-to-solve is the first evaluation with mean return >= "
            "the stop threshold (greedy policy, 20 held-out episodes).") if control else \
        f"\n\n`eval` is `{key}` on the held-out prompts; peak RSS is each run's own process."
    return "\n".join(lines) + note + "\n"



def _curve_figure(runs: list[dict[str, Any]], panels: list[tuple[str, str, str, bool]], title: str,
                  path: Path) -> None:
    """Panels of (curve name, x label, y label, smooth); one colour per algorithm, a line per seed."""
    fig = Figure(figsize=(5.4 * len(panels), 3.9), dpi=110, layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    fig.suptitle(title, fontsize=13, fontweight="bold")
    colors = {a: COLORS[i % len(COLORS)] for i, a in enumerate(dict.fromkeys(r["algo"] for r in runs))}
    for ax, (curve, xlabel, ylabel, smooth) in zip(axes, panels):
        labelled = set()
        for r in runs:
            xs, ys = r["curves"][curve]
            if not xs:
                continue
            label = None if r["algo"] in labelled else r["algo"]
            labelled.add(r["algo"])
            ax.plot(xs, ema(ys) if smooth and len(ys) >= 5 else ys, color=colors[r["algo"]], lw=1.8, label=label,
                    marker=None if smooth else "o", ms=3)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
        if labelled:
            ax.legend(frameon=False, fontsize=9)
    fig.savefig(path)


def _bar_figure(runs: list[dict[str, Any]], bars: list[tuple[str, str]], path: Path) -> None:
    algos = list(dict.fromkeys(r["algo"] for r in runs))
    fig = Figure(figsize=(4.2 * len(bars), 3.6), dpi=110, layout="constrained")
    axes = fig.subplots(1, len(bars), squeeze=False)[0]
    fig.suptitle("Cost per algorithm (mean over seeds)", fontsize=13, fontweight="bold")
    for ax, (field, label) in zip(axes, bars):
        values = []
        for a in algos:
            known = [r[field] for r in runs if r["algo"] == a and r.get(field) is not None]
            values.append(statistics.fmean(known) if known else 0.0)
        ax.bar(algos, values, color=[COLORS[i % len(COLORS)] for i in range(len(algos))])
        for i, v in enumerate(values):
            ax.annotate(f"{v:.3g}", (i, v), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
        ax.set_title(label, fontsize=11)
        ax.spines[["top", "right"]].set_visible(False)
    fig.savefig(path)


def write_comparison(runs: list[dict[str, Any]], out: Path, control: bool) -> Path:
    """``out/comparison.md``, ``out/comparison.json`` and ``out/plots/*.png``; returns the table's path."""
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    key = runs[0]["eval_key"] if runs else "eval"
    unit = "environment steps" if control else "training step"
    _curve_figure(runs, [("eval_x", unit, key, False), ("eval_wall", "wall time (s)", key, False)],
                  f"Held-out {key.split('/')[-1].replace('_', ' ')}", plots / "eval.png")
    _curve_figure(runs, [("reward_x", unit, "reward/mean", True), ("reward_wall", "wall time (s)", "reward/mean",
                                                                   True)],
                  "Training reward" + (" (episode return)" if control else ""), plots / "reward.png")
    _curve_figure(runs, [("kl_x", unit, "policy/kl", True)], "KL to the reference policy", plots / "kl.png")
    rate = "env steps / s" if control else "tokens / s"
    _bar_figure(runs, [("peak_rss_mb", "peak RSS (MiB)"), ("throughput", rate), ("step_time_s", "seconds / step")],
                plots / "cost.png")
    table = comparison_table(runs, control)
    images = "\n".join(f"![{name}](plots/{name}.png)" for name in ("eval", "reward", "kl", "cost"))
    (out / "comparison.md").write_text(f"# Comparison\n\n{table}\n{images}\n", encoding="utf-8")
    (out / "comparison.json").write_text(json.dumps(
        [{k: v for k, v in r.items() if k != "curves"} for r in runs], indent=2), encoding="utf-8")
    return out / "comparison.md"
