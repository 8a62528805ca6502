"""Plots and a static HTML report from a run folder.

A run folder holds ``metrics.jsonl`` (one JSON object per logged step; training lines and
evaluation lines, namespaced keys such as ``reward/mean`` or ``eval/accuracy``),
``completions.jsonl`` (sampled completions with their rewards), ``config.yaml`` (the resolved
config) and, at the end of a run, ``summary.json``. :func:`write_report` turns it into
``report/*.png`` and ``report/report.html``; :func:`summarize` gives the headline numbers.

Everything here tolerates a run that is still going or was killed: any metric may be missing (its
plot is skipped), a half-written last line is ignored, a step logged twice (after a resume) keeps
its latest value. Figures are built with ``matplotlib.figure.Figure`` directly, so no pyplot state
or global backend is touched.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from grouprl.report_html import Plot, StepSamples, render_html

METRICS_FILE = "metrics.jsonl"
COMPLETIONS_FILE = "completions.jsonl"
CONFIG_FILE = "config.yaml"
SUMMARY_FILE = "summary.json"
REPORT_DIR = "report"
# Keys of reward/... that are statistics over all functions, not one reward function.
REWARD_STATS = frozenset({"mean", "std", "min", "max"})
# Phases of a step in the order they run; unknown time/... keys are stacked after them.
TIME_PHASES = ("time/rollout", "time/reward", "time/logprobs", "time/update")
BEST_IS_MAX = ("reward/mean", "eval/accuracy", "eval/mean_reward")
LABELS = {
    "reward/mean": "total",
    "rollout/len_mean": "mean",
    "rollout/len_max": "max",
    "policy/clip_low": "low: ratio < 1-ε (A < 0)",
    "policy/clip_high": "high: ratio > 1+ε (A > 0)",
    "eval/accuracy": "accuracy",
    "eval/mean_reward": "mean reward",
}
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


# --------------------------------------------------------------------------- reading a run


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """JSON objects of a JSON-lines file, one per line. A line that does not parse is skipped:
    the last one silently (a run killed mid-write leaves half a line), any other with a warning."""
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


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one metric, sorted by step; a step logged twice (a resumed run repeats
    the steps after its last checkpoint) keeps the later value; non-finite values are dropped."""
    by_step: dict[float, float] = {}
    for record in records:
        step, value = record.get("step"), record.get(key)
        if _is_number(step) and _is_number(value):
            by_step[step] = float(value)
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def metric_keys(records: list[dict[str, Any]]) -> list[str]:
    """Every key with at least one finite numeric value, except step and wall_time."""
    keys = {k for r in records for k, v in r.items() if _is_number(v)}
    return sorted(keys - {"step", "wall_time"})


def ema(values: list[float], span: float | None = None) -> list[float]:
    """Exponential moving average with alpha = 2 / (span + 1), started at the first value (so no
    bias towards 0). The default span, a tenth of the points (at least 2), smooths a 30-step run
    lightly and a 1000-step run strongly, so the trend shows at any length."""
    if not values:
        return []
    alpha = 2.0 / ((span or max(2.0, len(values) / 10)) + 1.0)
    out = [values[0]]
    for v in values[1:]:
        out.append(out[-1] + alpha * (v - out[-1]))
    return out


# --------------------------------------------------------------------------- summary


def _eval_at_ends(records: list[dict[str, Any]]) -> tuple[dict[str, float] | None, dict[str, float] | None]:
    """Evaluation at step 0 (before training, if logged) and at the last evaluated step."""
    evals: dict[float, dict[str, float]] = {}
    for r in records:
        found = {k[len("eval/"):]: float(v) for k, v in r.items() if k.startswith("eval/") and _is_number(v)}
        if found and _is_number(r.get("step")):
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
    """The run's headline numbers: steps, wall time, final and best values of every metric,
    evaluation before and after training (from summary.json, else from the eval lines)."""
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
    steps = [r["step"] for r in records if _is_number(r.get("step"))]
    walls = [r["wall_time"] for r in records if _is_number(r.get("wall_time"))]
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


# --------------------------------------------------------------------------- plots


class Panel(NamedTuple):
    title: str
    ylabel: str
    keys: tuple[str, ...]
    fraction: bool = False
    """Values are fractions in [0, 1]: the y axis then starts at 0 and ends at 1 or just above the data."""
    smooth: bool = True
    """Draw an EMA over the raw points (off for schedules, which are not noisy)."""
    from_zero: bool = False
    """Start the y axis at 0 (a constant learning rate otherwise fills the axis with noise-sized ticks)."""


def _label(key: str) -> str:
    return LABELS.get(key, key.split("/", 1)[-1])


def _style(ax: Any, ylabel: str, fraction: bool = False) -> None:
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if fraction:  # start at 0; small fractions (clipping is often ~1%) keep a readable scale
        data_max = ax.dataLim.y1 if ax.has_data() else 1.0
        ax.set_ylim(0, 1.02 if data_max > 0.5 else max(0.02, data_max * 1.25))


def _figure(n_panels: int, title: str) -> tuple[Figure, list[Any]]:
    fig = Figure(figsize=(max(6.5, 5.2 * n_panels), 3.8), dpi=110, layout="constrained")
    axes = fig.subplots(1, n_panels, squeeze=False)[0]
    fig.suptitle(title, fontsize=13, fontweight="bold")
    return fig, list(axes)


def _draw_series(ax: Any, steps: list[float], values: list[float], color: str, label: str, smooth: bool) -> bool:
    """Raw per-step values faint and their EMA bold. Returns whether it smoothed: with a handful of
    points, or for a schedule such as the learning rate, the plain line is the honest picture."""
    if not smooth or len(values) < 5:
        ax.plot(steps, values, color=color, marker="o" if len(values) < 5 else None, lw=1.8, label=label)
        return False
    marker = "." if len(values) <= 100 else None  # past ~100 points markers only add noise
    ax.plot(steps, values, color=color, lw=0.9, alpha=0.35, marker=marker, ms=3)
    ax.plot(steps, ema(values), color=color, lw=2.2, label=label)
    return True


def _legend(ax: Any, n_series: int, smoothed: bool, color: str) -> None:
    """Series names when there are several, plus what faint and bold mean when smoothed."""
    handles = ax.get_legend_handles_labels()[0] if n_series > 1 else []
    if smoothed:
        tone = "0.35" if n_series > 1 else color
        handles += [Line2D([], [], color=tone, lw=0.9, alpha=0.45, marker=".", ms=3, label="per step"),
                    Line2D([], [], color=tone, lw=2.2, label="moving average")]
    if handles:
        ax.legend(handles=handles, frameon=False, fontsize=8.5)


def _plot_panels(records: list[dict[str, Any]], path: Path, title: str, panels: list[Panel]) -> bool:
    """One figure with a panel per entry that has data; nothing written when none has."""
    filled = [(p, [(k, *series(records, k)) for k in p.keys]) for p in panels]
    filled = [(p, [(k, s, v) for k, s, v in data if v]) for p, data in filled]
    filled = [(p, data) for p, data in filled if data]
    if not filled:
        return False
    fig, axes = _figure(len(filled), title)
    for ax, (panel, data) in zip(axes, filled):
        smoothed = False
        for i, (key, steps, values) in enumerate(data):
            smoothed |= _draw_series(ax, steps, values, COLORS[i % len(COLORS)], _label(key), panel.smooth)
        ax.set_title(panel.title, fontsize=11)
        _style(ax, panel.ylabel, panel.fraction)
        if panel.from_zero:
            ax.set_ylim(0, max(ax.dataLim.y1 * 1.1, 1e-12))
        _legend(ax, len(data), smoothed, COLORS[0])
    fig.savefig(path)
    return True


def _annotate_points(ax: Any, steps: list[float], values: list[float], color: str) -> None:
    if len(values) > 12:
        return  # labels would overlap; the line speaks for itself
    for s, v in zip(steps, values):
        ax.annotate(f"{v:.2f}", (s, v), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=8,
                    color=color)


def _plot_eval(records: list[dict[str, Any]], path: Path, keys: list[str]) -> bool:
    """Held-out metrics at each evaluation: points joined by lines, values written on them."""
    rate_keys = [k for k in ["eval/accuracy", *sorted(k for k in keys if k.startswith("eval/pass@"))] if k in keys]
    panels = [("Accuracy on held-out prompts", "fraction correct", rate_keys, True),
              ("Mean reward on held-out prompts", "reward", ["eval/mean_reward"] if "eval/mean_reward" in keys else [],
               False)]
    panels = [p for p in panels if p[2]]
    if not panels:
        return False
    fig, axes = _figure(len(panels), "Held-out evaluation")
    for ax, (title, ylabel, panel_keys, fraction) in zip(axes, panels):
        for i, key in enumerate(panel_keys):
            steps, values = series(records, key)
            color = COLORS[i % len(COLORS)]
            ax.plot(steps, values, color=color, marker="o", lw=2, label=_label(key))
            _annotate_points(ax, steps, values, color)
        ax.set_title(title, fontsize=11)
        _style(ax, ylabel, fraction)
        if fraction:
            ax.set_ylim(0, 1.08)  # room for the labels above points at 1.0
        ax.margins(x=0.06)
        if len(panel_keys) > 1:
            ax.legend(frameon=False, fontsize=9, loc="lower right")
    fig.savefig(path)
    return True


def _plot_time(records: list[dict[str, Any]], path: Path, keys: list[str]) -> bool:
    """Seconds per step stacked by phase; the part of time/step no phase accounts for is 'other'."""
    phases = [k for k in TIME_PHASES if k in keys] + sorted(
        k for k in keys if k.startswith("time/") and k not in TIME_PHASES and k != "time/step")
    by_phase = {k: dict(zip(*series(records, k))) for k in phases}
    total = dict(zip(*series(records, "time/step")))
    steps = sorted(set(total).union(*by_phase.values()))
    if not steps:
        return False
    layers = {_label(k): [by_phase[k].get(s, 0.0) for s in steps] for k in phases}
    other = [max(0.0, total.get(s, 0.0) - sum(layer[i] for layer in layers.values())) for i, s in enumerate(steps)]
    if any(o > 0 for o in other):
        layers["other"] = other
    fig, (ax,) = _figure(1, "Time per step, by phase")
    colors = [*COLORS[: len(layers) - ("other" in layers)], "#bbbbbb"][: len(layers)]
    if len(steps) <= 80:
        bottom = [0.0] * len(steps)
        for (name, values), color in zip(layers.items(), colors):
            ax.bar(steps, values, bottom=bottom, color=color, label=name, width=0.85)
            bottom = [b + v for b, v in zip(bottom, values)]
    else:  # bars thinner than a pixel: draw areas
        ax.stackplot(steps, *layers.values(), labels=list(layers), colors=colors)
    _style(ax, "seconds")
    ax.legend(frameon=False, fontsize=9, ncol=min(5, len(layers)), loc="upper left", bbox_to_anchor=(0, -0.18))
    fig.savefig(path)
    return True


def _reward_fn_keys(keys: list[str]) -> tuple[str, ...]:
    return tuple(k for k in keys if k.startswith("reward/") and k.count("/") == 1 and k[7:] not in REWARD_STATS)


def _panel_plots(keys: list[str]) -> list[tuple[str, str, list[Panel]]]:
    """(file name, figure title, panels) of every plot drawn as smoothed curves."""
    return [
        ("reward.png", "Reward", [Panel("Total reward", "mean reward per completion", ("reward/mean",)),
                                  Panel("Per reward function", "mean reward", _reward_fn_keys(keys))]),
        ("kl.png", "KL divergence from the reference policy",
         [Panel("policy/kl, mean over completion tokens", "KL per token (k3 estimate)", ("policy/kl",))]),
        ("entropy.png", "Policy entropy", [Panel("policy/entropy, mean over completion tokens", "nats per token",
                                                     ("policy/entropy",))]),
        ("length.png", "Completion length",
         [Panel("Tokens per completion", "tokens", ("rollout/len_mean", "rollout/len_max")),
          Panel("Truncated (hit max_new_tokens)", "fraction of completions", ("rollout/truncated_frac",), True)]),
        ("clip.png", "Clipped probability ratios",
         [Panel("Fraction of tokens clipped", "fraction of tokens", ("policy/clip_low", "policy/clip_high"), True)]),
        ("zero_std.png", "Groups without learning signal",
         [Panel("Groups whose rewards are all equal", "fraction of groups", ("rollout/zero_std_frac",), True)]),
        ("loss.png", "Loss", [Panel("Total and policy loss", "loss", ("loss/total", "loss/policy")),
                              Panel("KL penalty term (beta × KL)", "loss", ("loss/kl",))]),
        ("optim.png", "Optimizer", [Panel("Gradient norm (before clipping)", "L2 norm", ("optim/grad_norm",)),
                                    Panel("Learning rate", "learning rate", ("optim/lr",), smooth=False,
                                          from_zero=True)]),
    ]


# Order in the report: what a reader checks first comes first.
PLOT_ORDER = ("reward.png", "accuracy.png", "zero_std.png", "kl.png", "entropy.png", "length.png", "clip.png",
              "time.png", "loss.png", "optim.png")


def write_plots(records: list[dict[str, Any]], out_dir: Path) -> list[str]:
    """Write every plot whose metrics are present into ``out_dir``; returns the file names in
    report order. Plots of this report whose metrics are now absent are removed, so a rerun never
    leaves a stale image behind."""
    out_dir.mkdir(parents=True, exist_ok=True)
    keys = metric_keys(records)
    written = {name for name, title, panels in _panel_plots(keys)
               if _plot_panels(records, out_dir / name, title, panels)}
    if _plot_eval(records, out_dir / "accuracy.png", keys):
        written.add("accuracy.png")
    if _plot_time(records, out_dir / "time.png", keys):
        written.add("time.png")
    for name in set(PLOT_ORDER) - written:
        (out_dir / name).unlink(missing_ok=True)
    return [name for name in PLOT_ORDER if name in written]


# --------------------------------------------------------------------------- completions and HTML


def sample_steps(path: Path, how_many: int = 3) -> list[int]:
    """First, middle and last steps that have logged completions (fewer if fewer exist)."""
    steps = sorted({r["step"] for r in iter_jsonl(path) if _is_number(r.get("step"))})
    if len(steps) <= how_many:
        return steps
    picks = [steps[round(i * (len(steps) - 1) / (how_many - 1))] for i in range(how_many)]
    return sorted(set(picks))


def read_samples(path: Path, steps: list[int], max_rows: int = 24) -> list[StepSamples]:
    """Up to ``max_rows`` completions for each of ``steps``, in logged order (a second pass over
    the file instead of holding every completion of a long run in memory)."""
    rows: dict[int, list[dict[str, Any]]] = {s: [] for s in steps}
    counts, sums, scored = dict.fromkeys(steps, 0), dict.fromkeys(steps, 0.0), dict.fromkeys(steps, 0)
    for r in iter_jsonl(path):
        step = r.get("step")
        if step in rows:
            counts[step] += 1
            if _is_number(r.get("reward")):
                sums[step] += r["reward"]
                scored[step] += 1
            if len(rows[step]) < max_rows:
                rows[step].append(r)
    return [StepSamples(s, rows[s], counts[s], sums[s] / scored[s] if scored[s] else None) for s in steps]


def _write_text_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)  # a reader never sees half a report
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
    _write_text_atomic(html_path, render_html(summary, plots, samples, config_text, links))
    return html_path
