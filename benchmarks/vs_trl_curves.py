"""``benchmarks/vs_trl.py --curves N``: the reward and completion length per step of grouprl and TRL over N
steps, a permutation test of their means, and the plot (``curves.json``, ``curves.png``)."""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections.abc import Callable
from pathlib import Path


def permutation_p(a: list[float], b: list[float], rounds: int = 20000, seed: int = 0) -> float:
    """Two-sided permutation test of a difference in means (no distributional assumption)."""
    rng = random.Random(seed)
    observed = abs(statistics.fmean(a) - statistics.fmean(b))
    pooled, n, hits = a + b, len(a), 0
    for _ in range(rounds):
        rng.shuffle(pooled)
        hits += abs(statistics.fmean(pooled[:n]) - statistics.fmean(pooled[n:])) >= observed - 1e-12
    return (hits + 1) / (rounds + 1)


def curves(args: argparse.Namespace, run_pair: Callable[[argparse.Namespace, float, int, int], dict]) -> None:
    """Reward per step of both frameworks over ``args.curves`` steps for each seed, each seed's steps taken by
    ``run_pair(args, beta, steps, seed)`` (``vs_trl.run_pair``); a plot and a test."""
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    data = {}
    for seed in args.seeds:
        result = run_pair(args, args.betas[0], args.curves, seed)
        data[seed] = {k: [(r["reward"], r["len_mean"]) for r in v] for k, v in result["records"].items()}
    (out / "curves.json").write_text(json.dumps(data, indent=1))
    rewards = {k: [r for s in data.values() for r, _ in s[k]] for k in ("grouprl", "trl")}
    lengths = {k: [n for s in data.values() for _, n in s[k]] for k in ("grouprl", "trl")}
    for k in rewards:
        print(f"{k:7s} mean reward {statistics.fmean(rewards[k]):.3f} over {len(rewards[k])} steps, "
              f"mean completion {statistics.fmean(lengths[k]):.1f} tokens")
    print(f"permutation test, same mean reward per step: p={permutation_p(rewards['grouprl'], rewards['trl']):.3f}; "
          f"same mean completion length: p={permutation_p(lengths['grouprl'], lengths['trl']):.3f}")
    plot_curves(data, out / "curves.png")
    print(f"wrote {out / 'curves.png'} and {out / 'curves.json'}")


def plot_curves(data: dict, path: Path) -> None:
    """Reward and completion length per step, both frameworks, every seed of ``data`` (curves.json)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for seed, per in data.items():
        for k, style in (("grouprl", "-"), ("trl", "--")):
            steps = range(1, len(per[k]) + 1)
            axes[0].plot(steps, [r for r, _ in per[k]], style, marker=".", label=f"{k} seed {seed}")
            axes[1].plot(steps, [n for _, n in per[k]], style, marker=".", label=f"{k} seed {seed}")
    axes[0].set(xlabel="step", ylabel="mean reward (exact match)", title="Reward per step")
    axes[1].set(xlabel="step", ylabel="mean completion length (tokens)", title="Completion length per step")
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
