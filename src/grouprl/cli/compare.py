"""``grouprl compare``: several algorithms on the same task, model, seeds and budget. Each (algorithm, seed)
trains in its own spawned process, so its peak memory is its own and no state leaks between runs."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from grouprl.config import check
from grouprl.errors import ConfigError
from grouprl.run.files import as_plain, write_text_atomic
from grouprl.run.folder import claimed, holds_run


@dataclass
class CompareConfig:
    algos: tuple[str, ...] = ("grpo", "rloo", "ppo", "trpo")
    """Algorithms to run: grpo, reinforce, rloo, ppo, trpo for language models; grpo, ppo, trpo, vpg with env."""
    seeds: tuple[int, ...] = (0,)
    """Seeds; every algorithm runs once per seed and the table gives the mean (and spread)."""
    env: str | None = None
    """A gymnasium id to compare on classic control (other options are then `grouprl rl`'s, else `grouprl train`'s)."""
    output_dir: str = "runs/compare"
    """Folder of the comparison: one run folder per algorithm and seed, comparison.md, plots/."""
    wall_budget_s: float | None = None
    """Also stop each run after this many seconds of wall time."""
    algo_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Language models: options per algorithm over the shared ones, e.g. {trpo: {max_kl: 0.05}}."""

    def __post_init__(self) -> None:
        if not self.algos or not self.seeds:
            raise ValueError("algos and seeds must each name at least one entry")
        if self.env:
            from grouprl.control import ALGORITHMS  # needs gymnasium: only for a classic-control comparison

            valid = ALGORITHMS.names()
        else:
            from grouprl.trainer.algorithms import ALGORITHMS

            valid = ALGORITHMS.names()
        bad = [a for a in self.algos if a not in valid]
        if bad:
            raise ValueError(f"algos: {', '.join(bad)} not available for "
                             f"{'classic control' if self.env else 'language models'}; valid: {', '.join(valid)}")
        if len(set(self.algos)) != len(self.algos):
            raise ValueError(f"algos lists an algorithm twice: {', '.join(self.algos)}")
        unknown = set(self.algo_options) - set(self.algos)
        if unknown:
            raise ValueError(f"algo_options for {', '.join(sorted(unknown))}, which is not in algos")


def lm_algorithm_config(run: Any, algo: str, options: dict[str, Any]) -> Any:
    """The run config of ``algo``: ``run``'s shared settings with ``options`` on top, checked."""
    own = {f.name for f in fields(run)}
    unknown = set(options) - own
    if unknown:
        raise ValueError(f"algo_options.{algo}: {', '.join(sorted(unknown))} is not a train option")
    try:
        config = replace(run, algo=algo, **options)
        check(config)
        return config
    except ValueError as e:
        raise ValueError(f"{algo}: {e}") from None


def _train_lm(run: Any, algo: str, options: dict[str, Any], wall_budget_s: float | None) -> None:
    """Child process: train ``algo`` on the run config ``run`` and write its report."""
    from grouprl.cli.build import build_inputs, build_trainer, load_model
    from grouprl.report import write_report

    config = lm_algorithm_config(run, algo, options)
    inputs = build_inputs(config)
    policy, tokenizer = load_model(config.model, config.seed)
    trainer = build_trainer(config, inputs, policy, tokenizer)
    trainer.time_budget_s = wall_budget_s
    trainer.train()
    write_report(config.output_dir)


def _train_control(run: Any, algo: str, options: dict[str, Any], wall_budget_s: float | None) -> None:
    """Child process: train ``algo`` on the control config ``run`` and write its report."""
    from grouprl.control.training import ControlTrainer
    from grouprl.report import write_report

    trainer = ControlTrainer(replace(run, algo=algo))
    trainer.time_budget_s = wall_budget_s
    trainer.train()
    write_report(run.output_dir)


def _in_child(target: Callable[..., None], *args: Any) -> None:
    """Run ``target(*args)`` in a fresh spawned process; raise if it fails."""
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=target, args=args)
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        raise RuntimeError(f"the run {args[1]!r} in {getattr(args[0], 'output_dir', '?')} failed "
                           f"(exit code {proc.exitcode}); its traceback is above")


def run_compare(compare: CompareConfig, base: Any, echo: Callable[[str], None] = print,
                overwrite: bool = False) -> Path:
    """Train each (algorithm, seed) of ``compare`` on ``base``, all checked first; write comparison.md (returned)."""
    out = Path(compare.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    jobs = []
    for algo in compare.algos:
        for seed in compare.seeds:
            run = replace(base, seed=seed, output_dir=str(out / f"{algo}-seed{seed}"))
            if compare.env:
                run = replace(run, env=compare.env, algo=algo)
            else:
                lm_algorithm_config(run, algo, compare.algo_options.get(algo, {}))  # fail fast on a bad option
            jobs.append((algo, seed, run))
    held = [run.output_dir for _, _, run in jobs if holds_run(run.output_dir)]
    if held and not overwrite:
        raise ConfigError(f"{out} already holds runs ({', '.join(Path(h).name for h in held)}); their logs would "
                          "be mixed into the comparison. Replace them with --overwrite or choose another --output_dir")
    with contextlib.ExitStack() as folders:  # every run folder claimed (and checked) before the first run
        for _, _, run in jobs:
            folders.enter_context(claimed(run, overwrite=overwrite, echo=echo))
        write_text_atomic(out / "compare_config.json", json.dumps(
            {"compare": as_plain(compare), "base": as_plain(base)}, indent=2, default=str))
        target = _train_control if compare.env else _train_lm
        for algo, seed, run in jobs:
            echo(f"compare: {algo} seed {seed} -> {run.output_dir}")
            _in_child(target, run, algo, compare.algo_options.get(algo, {}), compare.wall_budget_s)
    from grouprl.report.comparison_table import summarize_runs, write_comparison

    runs = summarize_runs([(algo, seed, Path(run.output_dir)) for algo, seed, run in jobs], control=bool(compare.env))
    table = write_comparison(runs, out, control=bool(compare.env))
    echo(f"comparison: {table}")
    echo(f"plots: {out / 'plots'}")
    return table
