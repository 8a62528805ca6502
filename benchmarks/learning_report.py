"""The report of ``benchmarks/learning.py``: held-out accuracy per step and per second of each framework, the
step and time-gain ratios (defined in that script's docstring), the ablation table and the plot, all read back
from ``results.jsonl`` files (so ``--report_only`` needs no model)."""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from machine import cpu_line  # benchmarks/machine.py: every figure says which CPU it came from

FRAMEWORKS = ("grouprl", "trl")


def read_records(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def by_run(records: list[dict]) -> dict[tuple[str, int], list[dict]]:
    """(framework, seed) -> its records by step; only finished runs (those reaching the settings' last step)."""
    runs: dict[tuple[str, int], list[dict]] = {}
    for r in records:
        runs.setdefault((r["framework"], r["seed"]), []).append(r)
    return {k: sorted(v, key=lambda r: r["step"]) for k, v in runs.items()
            if any(r["step"] == r["settings"]["steps"] for r in v)}


def interpolate(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear y at x (xs increasing), held at the ends."""
    if x <= xs[0]:
        return ys[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return ys[-1]


def trl_gain_at(t: list[dict], base: float, seconds: float) -> float:
    """TRL's gain over ``base`` after ``seconds`` of training: linear between its saved steps, 0 at 0 s."""
    return interpolate([0.0] + [r["train_seconds"] for r in t[1:]], [0.0] + [r["accuracy"] - base for r in t[1:]],
                       seconds)


def time_gain_by_step(runs: dict) -> dict[int, list[float]]:
    """grouprl's saved step -> per seed, (its gain over the base there) / (TRL's gain at the same training
    seconds): the time_gain_ratio had training stopped at that step. Seeds where TRL's gain is <= 0 are left out."""
    out: dict[int, list[float]] = {}
    for (name, seed), g in sorted(runs.items()):
        if name != "grouprl" or ("trl", seed) not in runs:
            continue
        t, base = runs["trl", seed], g[0]["accuracy"]
        for r in g[1:]:
            gain = trl_gain_at(t, base, r["train_seconds"])
            if gain > 0:
                out.setdefault(r["step"], []).append((r["accuracy"] - base) / gain)
    return out


def ratios(runs: dict) -> tuple[float, float, list[dict], list[str]]:
    """(step_ratio, time_gain_ratio, per-seed rows, notes), as the module docstring defines them."""
    seeds = sorted({s for (n, s) in runs if ("grouprl", s) in runs and ("trl", s) in runs})
    rows, notes = [], []
    for s in seeds:
        g, t = runs["grouprl", s], runs["trl", s]
        base = g[0]["accuracy"]
        g_last, t_last = g[-1]["accuracy"], t[-1]["accuracy"]
        seconds = g[-1]["train_seconds"]
        t_gain = trl_gain_at(t, base, seconds)
        if seconds > t[-1]["train_seconds"]:
            notes.append(f"seed {s}: grouprl trained longer ({seconds:.0f} s) than TRL "
                         f"({t[-1]['train_seconds']:.0f} s); TRL's gain is held at its last step's")
        step_ratio = g_last / t_last if t_last > 0 else math.inf
        if t_gain <= 0:
            notes.append(f"seed {s}: TRL's gain over the base after {seconds:.0f} s is {t_gain:+.3f} (<= 0): "
                         "its time_gain_ratio is inf")
            time_ratio = math.inf
        else:
            time_ratio = (g_last - base) / t_gain
        rows.append({"seed": s, "base": base, "grouprl": g_last, "trl": t_last, "grouprl_s": seconds,
                     "trl_s": t[-1]["train_seconds"], "trl_gain_at": t_gain, "step_ratio": step_ratio,
                     "time_gain_ratio": time_ratio})
    mean = (lambda xs: statistics.fmean(xs) if xs else math.nan)
    return (mean([r["step_ratio"] for r in rows]), mean([r["time_gain_ratio"] for r in rows]), rows, notes)


def per_step(runs: dict, name: str) -> dict[int, dict]:
    """step -> {acc: [per seed], seconds: [per seed]} of framework ``name``."""
    table: dict[int, dict] = {}
    for (n, _), recs in sorted(runs.items()):
        if n == name:
            for r in recs:
                table.setdefault(r["step"], {"acc": [], "seconds": []})
                table[r["step"]]["acc"].append(r["accuracy"])
                table[r["step"]]["seconds"].append(r["train_seconds"])
    return dict(sorted(table.items()))


def cell(xs: list[float]) -> str:
    if not xs:
        return "-"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.fmean(xs):.3f} ± {sd:.3f} ({min(xs):.3f}-{max(xs):.3f})"


def compared(args: argparse.Namespace, records: list[dict], own_settings: dict) -> list[dict]:
    """The other frameworks' records of ``--compare_with``'s results, checked to share this run's saved steps and
    evaluation (an ablation's TRL curve is the baseline's). A baseline that trained longer serves a shorter run:
    its saved steps up to this run's last are the models a run of that length saves (at the demo's constant
    learning rate)."""
    mine = {r["framework"] for r in records}
    theirs = [r for r in read_records(Path(args.compare_with) / "results.jsonl") if r["framework"] not in mine]
    keys = ("save_every", "eval_problems", "eval_samples", "threads")
    own = records[0]["settings"] if records else own_settings  # --report_only: the settings the run had
    wanted = {k: own[k] for k in keys}
    wrong = sorted({json.dumps({k: r["settings"][k] for k in keys}) for r in theirs} - {json.dumps(wanted)})
    shorter = sorted({r["settings"]["steps"] for r in theirs if r["settings"]["steps"] < own["steps"]})
    if wrong or shorter:
        raise SystemExit(f"{args.compare_with} was run with other settings "
                         f"({', '.join(wrong + [f'steps {n}' for n in shorter])}), not {wanted} over "
                         f"{own['steps']} steps or more")
    return [{**r, "settings": {**r["settings"], "steps": own["steps"]}} for r in theirs if r["step"] <= own["steps"]]


def report(args: argparse.Namespace, own_settings: dict) -> None:
    """``learning.md``, ``learning.png`` and the last line from ``--out``'s results (and ``--compare_with``'s
    other frameworks, checked against ``own_settings``, this run's settings)."""
    out = Path(args.out)
    records = read_records(out / "results.jsonl")
    if args.compare_with:
        records += compared(args, records, own_settings)
    runs = by_run(records)
    if not runs:
        raise SystemExit(f"no finished runs in {out / 'results.jsonl'}")
    tables = {n: per_step(runs, n) for n in FRAMEWORKS}
    steps = sorted(set(tables["grouprl"]) | set(tables["trl"]))
    seeds = {n: sorted(s for (m, s) in runs if m == n) for n in FRAMEWORKS}
    step_ratio, time_ratio, rows, notes = ratios(runs)
    first = records[0]
    st = first["settings"]
    changed = ", ".join(f"{k}={v}" for k, v in st.get("grouprl_overrides", {}).items())
    lines = [
        "# Learning per step and per second: grouprl against TRL's GRPOTrainer", "",
        f"{cpu_line()}", "",
        "SmolLM2-135M-Instruct on the arithmetic task"
        + (f" with options {json.dumps(st['task_options'])}" if st.get("task_options") else "")
        + " at `grouprl demo`'s settings (4 prompts x G=8, 12 new tokens, "
        f"lr 2e-5, beta 0.04, fp32, mu=1), {st['threads']} torch thread(s) per framework, steps taken in turn; TRL "
        f"gradient checkpointing {st['trl_gradient_checkpointing']}. "
        + (f"**grouprl changed from the demo's settings: {changed}** (TRL's curve from `{args.compare_with}`). "
           if changed and args.compare_with else "")
        + (f"**Changed from the demo's settings, for both: {changed}.** " if changed and not args.compare_with else "")
        + f"Held-out accuracy: grouprl's evaluator on "
        f"{st['eval_problems']} problems x {st['eval_samples']} samples at temperature 1, the same problems and "
        f"sampling seeds for every model. Seeds: grouprl {seeds['grouprl']}, TRL {seeds['trl']}. "
        "Cells: mean ± std (min-max) over seeds; seconds: cumulative training time (steps only), mean over seeds.",
        "Time-gain ratio at a step: grouprl's gain over the base there / TRL's gain after the same training "
        "seconds, mean (min-max) over seeds.",
        "", "| step | grouprl accuracy | TRL accuracy | grouprl s | TRL s | time-gain ratio |",
        "|---:|---|---|---:|---:|---|"]
    by_step = time_gain_by_step(runs)
    for step in steps:
        g, t, tg = tables["grouprl"].get(step), tables["trl"].get(step), by_step.get(step)
        lines.append(f"| {step} | {cell(g['acc'] if g else [])} | {cell(t['acc'] if t else [])} | "
                     f"{statistics.fmean(g['seconds']) if g else math.nan:.0f} | "
                     f"{statistics.fmean(t['seconds']) if t else math.nan:.0f} | "
                     + (f"{statistics.fmean(tg):.2f} ({min(tg):.2f}-{max(tg):.2f})" if tg else "-") + " |")
    lines += ["", "Per seed, at the last step:", "",
              "| seed | base | grouprl | TRL | grouprl s | TRL s | TRL gain at grouprl's s | step ratio | "
              "time-gain ratio |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['seed']} | {r['base']:.3f} | {r['grouprl']:.3f} | {r['trl']:.3f} | {r['grouprl_s']:.0f} | "
              f"{r['trl_s']:.0f} | {r['trl_gain_at']:+.3f} | {r['step_ratio']:.2f} | {r['time_gain_ratio']:.2f} |"
              for r in rows]
    lines += [""] + [f"- {n}" for n in notes] + ([""] if notes else [])
    last = f"step_ratio={step_ratio:.2f} time_gain_ratio={time_ratio:.2f}"
    commands = sorted({r["command"] for r in records})
    lines += ["step_ratio: mean over seeds of grouprl's last-step accuracy / TRL's; time_gain_ratio: mean over seeds "
              "of grouprl's gain over the base at its last step / TRL's gain at the same training seconds "
              "(interpolated between its saved steps; 0 at 0 s).", "", f"`{last}`", "",
              "Command" + ("s" if len(commands) > 1 else "") + ":", "", "```", *commands, "```", ""]
    (out / "learning.md").write_text("\n".join(lines))
    plot(tables, out / "learning.png")
    print("\n".join(lines[7:7 + 3 + len(steps)]))
    for n in notes:
        print(n)
    print(f"wrote {out / 'learning.md'} and {out / 'learning.png'}")
    print(last)


def ablations(args: argparse.Namespace) -> None:
    """One line per ablation folder under ``--ablations`` (and the baseline, ``--compare_with``): grouprl's mean
    held-out accuracy per saved step over the seeds every row has finished (so rows compare like with like), its
    fall from the best saved step to the last, and step_ratio against the baseline's TRL; written to
    ``ablations.md`` there. Each row runs as long as it trained (a shorter one's later cells read ``-``), and
    its fall and step_ratio are taken at its own last step, against TRL at that step, so a 12-step ablation
    beside 24-step ones neither cuts their table nor is read against steps it never ran."""
    base = by_run(read_records(Path(args.compare_with) / "results.jsonl"))
    folders = [("baseline (the demo's settings)", Path(args.compare_with))]
    folders += [(f.name, f) for f in sorted(Path(args.ablations).iterdir()) if (f / "results.jsonl").is_file()]
    rows = [(name, {k: v for k, v in by_run(read_records(f / "results.jsonl")).items() if k[0] == "grouprl"})
            for name, f in folders]
    rows.append(("TRL (baseline)", {k: v for k, v in base.items() if k[0] == "trl"}))
    seeds = set.intersection(*[{s for (_, s) in runs} for _, runs in rows])
    trl = {k: v for k, v in base.items() if k[0] == "trl" and k[1] in seeds}
    rows = [(name, {k: v for k, v in runs.items() if k[1] in seeds}) for name, runs in rows]
    steps = sorted({r["step"] for _, runs in rows for v in runs.values() for r in v})
    apart = False
    lines = [f"{cpu_line()}", "", "grouprl's held-out accuracy, mean over seeds "
             f"{', '.join(map(str, sorted(seeds)))} (those every row has finished), at each saved step; one setting "
             "changed from the demo's per row (same seeds, same evaluation); `-`: past the row's last step; "
             "`fall`: the best saved step's mean minus the last one's; `step_ratio`: as in learning.md, against "
             "the baseline's TRL at the row's last step.", "",
             "| run | " + " | ".join(f"step {k}" for k in steps) + " | fall | step_ratio |",
             "|---|" + "---:|" * (len(steps) + 2)]
    start = statistics.fmean(per_step(rows[0][1], "grouprl")[0]["acc"])
    for name, runs in rows:
        framework = next(iter(runs))[0]
        table = per_step(runs, framework)
        if abs(statistics.fmean(table[0]["acc"]) - start) > 1e-9:
            name, apart = f"{name} (*)", True
        own = [statistics.fmean(table[k]["acc"]) for k in steps if k in table]
        last = max(table)
        step_ratio = 1.0
        if framework == "grouprl":
            step_ratio = ratios({**runs, **{k: [r for r in v if r["step"] <= last] for k, v in trl.items()}})[0]
        cells = [f"{statistics.fmean(table[k]['acc']):.3f}" if k in table else "-" for k in steps]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {max(own) - own[-1]:.3f} | {step_ratio:.2f} |")
    if apart:
        lines += ["", "(*) Its step 0 is not the baseline's: scored by another evaluation (engine or problems); "
                  "compare it with rows of its own step 0, not with the rest."]
    lines += ["", "Commands:", "", "```", *sorted({r["command"] for _, f in folders
                                                  for r in read_records(f / "results.jsonl")}), "```", ""]
    (Path(args.ablations) / "ablations.md").write_text("\n".join(lines))
    print("\n".join(lines[2:-6]))


def plot(tables: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    for (name, table), color in zip(tables.items(), ("tab:blue", "tab:orange")):
        if not table:
            continue
        steps = list(table)
        mean = [statistics.fmean(table[s]["acc"]) for s in steps]
        low = [min(table[s]["acc"]) for s in steps]
        high = [max(table[s]["acc"]) for s in steps]
        seconds = [statistics.fmean(table[s]["seconds"]) for s in steps]
        n = len(table[steps[-1]]["acc"])
        for ax, xs in ((axes[0], steps), (axes[1], seconds)):
            ax.plot(xs, mean, "-o", color=color, label=f"{name} (mean of {n} seed{'s' if n > 1 else ''})")
            ax.fill_between(xs, low, high, color=color, alpha=0.2, label=f"{name} min-max")
    axes[0].set(xlabel="step", ylabel="held-out accuracy", title="Accuracy per step")
    axes[1].set(xlabel="cumulative training seconds", ylabel="held-out accuracy", title="Accuracy per second")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
