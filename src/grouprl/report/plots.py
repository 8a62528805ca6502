"""The run report's PNG plots, one figure per theme, from a run's metrics records; built on
``matplotlib.figure.Figure`` directly, so no pyplot state or global backend is touched."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from grouprl.report.data import ema, metric_keys, series

REWARD_STATS = frozenset({"mean", "std", "min", "max"})  # reward/... over all functions, not one
TIME_PHASES = ("time/rollout", "time/reward", "time/logprobs", "time/update")
LABELS = {
    "reward/mean": "total",
    "rollout/len_mean": "mean",
    "rollout/len_max": "max",
    "policy/clip_low": "low: ratio < 1-ε (A < 0)",
    "policy/clip_high": "high: ratio > 1+ε (A > 0)",
    "eval/accuracy": "accuracy",
    "eval/success": "success",
    "eval/mean_reward": "mean reward",
}
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


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
    """Raw per-step values faint and their EMA bold; whether it smoothed (a few points or a schedule: plain)."""
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
    first = "eval/success" if "eval/success" in keys else "eval/accuracy"  # an agent's runs report success
    rate_keys = [k for k in [first, *sorted(k for k in keys if k.startswith("eval/pass@"))] if k in keys]
    what = ("Success on held-out resets", "fraction solved") if first == "eval/success" else \
        ("Accuracy on held-out prompts", "fraction correct")
    panels = [(*what, rate_keys, True),
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


def _reward_fn_panel(keys: list[str]) -> Panel:
    """Each reward function's mean; a single function is named in the title (a legend of one is not drawn)."""
    fns = _reward_fn_keys(keys)
    title = f"Reward function {fns[0][7:]}" if len(fns) == 1 else "Per reward function"
    return Panel(title, "mean reward", fns)


def _panel_plots(keys: list[str]) -> list[tuple[str, str, list[Panel]]]:
    """(file name, figure title, panels) of every plot drawn as smoothed curves."""
    return [
        ("reward.png", "Reward", [Panel("Total reward", "mean reward per completion", ("reward/mean",)),
                                  _reward_fn_panel(keys)]),
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


PLOT_ORDER = ("reward.png", "accuracy.png", "zero_std.png", "kl.png", "entropy.png", "length.png", "clip.png",
              "time.png", "loss.png", "optim.png")


def write_plots(records: list[dict[str, Any]], out_dir: Path) -> list[str]:
    """Write every plot whose metrics are present into ``out_dir``, remove stale ones; the names in report order."""
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
