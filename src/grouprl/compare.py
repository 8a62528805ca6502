"""``grouprl compare``: several algorithms on the same task, model, seeds and budget, measured.

Language models: every algorithm gets the same resolved :class:`~grouprl.config.TrainConfig`
(model, task, prompts per step, group size, steps, seeds); what differs is the trainer and its own
knobs (:data:`LM_ALGORITHMS`: GRPO, REINFORCE and RLOO as GRPO advantage estimators, PPO with
its critic, TRPO). Classic control: every algorithm gets the same
:class:`~grouprl.envs.ControlConfig` (environment, env-step budget, seeds).

Each (algorithm, seed) trains in its own spawned process, so ``memory/peak_rss_mb`` is that run's
own peak (a process's peak resident memory never goes down) and no state leaks between runs. The
output folder holds one run folder per (algorithm, seed) with its usual report, plus
``comparison.md`` (the table), ``comparison.json`` (the numbers) and ``plots/*.png``.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from grouprl.config import ConfigError
from grouprl.registry import Registry
from grouprl.run_dir import holds_run, prepare_output_dir


@dataclass
class CompareConfig:
    algos: tuple[str, ...] = ("grpo", "rloo", "ppo", "trpo")
    """Algorithms to run. Language models: grpo, reinforce, rloo, ppo, trpo. Classic control
    (with env): grpo, ppo, trpo, vpg."""
    seeds: tuple[int, ...] = (0,)
    """Seeds; every algorithm runs once per seed and the table gives the mean (and spread)."""
    env: str | None = None
    """A gymnasium environment id for a classic-control comparison (then every other option is a
    `grouprl rl` option, e.g. --total_env_steps); empty = language models (every other option is a
    `grouprl train` option, e.g. --model, --task, --total_steps)."""
    output_dir: str = "runs/compare"
    """Folder of the comparison: one run folder per algorithm and seed, comparison.md, plots/."""
    wall_budget_s: float | None = None
    """Also stop each run after this many seconds of wall time (the budget in wall-clock instead of,
    or on top of, steps)."""
    algo_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Language models: options per algorithm on top of the shared ones, e.g.
    {ppo: {vf_coef: 0.2, critic_model: tiny}, trpo: {max_kl: 0.05}}."""

    def __post_init__(self) -> None:
        if not self.algos or not self.seeds:
            raise ValueError("algos and seeds must each name at least one entry")
        if self.env:
            from grouprl.envs import ALGORITHMS  # needs gymnasium: only for a classic-control comparison

            valid = ALGORITHMS.names()
        else:
            valid = LM_ALGORITHMS.names()
        bad = [a for a in self.algos if a not in valid]
        if bad:
            raise ValueError(f"algos: {', '.join(bad)} not available for "
                             f"{'classic control' if self.env else 'language models'}; valid: {', '.join(valid)}")
        if len(set(self.algos)) != len(self.algos):
            raise ValueError(f"algos lists an algorithm twice: {', '.join(self.algos)}")
        unknown = set(self.algo_options) - set(self.algos)
        if unknown:
            raise ValueError(f"algo_options for {', '.join(sorted(unknown))}, which is not in algos")


# --------------------------------------------------------------------------- language-model algorithms


@dataclass(frozen=True)
class LMAlgorithm:
    """How to build one language-model algorithm from the shared run config."""

    trainer: str
    """``module:Class`` of the trainer (imported in the child process only)."""
    config: str
    """``module:Class`` of its config (a GRPOConfig subclass)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Settings that make it this algorithm (e.g. advantage=rloo)."""
    keep_own: tuple[str, ...] = ()
    """Shared fields not copied over, so the algorithm's own default applies (PPO puts the KL in the reward)."""


LM_ALGORITHMS: Registry[LMAlgorithm] = Registry("language-model algorithm")
LM_ALGORITHMS.register("grpo", LMAlgorithm("grouprl.trainer.grpo:GRPOTrainer", "grouprl.trainer.config:GRPOConfig"))
# REINFORCE and RLOO centre within the group without the std division (their own definitions).
LM_ALGORITHMS.register("reinforce", LMAlgorithm("grouprl.trainer.grpo:GRPOTrainer",
                                                "grouprl.trainer.config:GRPOConfig",
                                                {"advantage": "reinforce", "advantage_scale": "none"}))
LM_ALGORITHMS.register("rloo", LMAlgorithm("grouprl.trainer.grpo:GRPOTrainer", "grouprl.trainer.config:GRPOConfig",
                                           {"advantage": "rloo", "advantage_scale": "none"}))
LM_ALGORITHMS.register("ppo", LMAlgorithm("grouprl.trainer.ppo:PPOTrainer", "grouprl.trainer.ppo:PPOConfig",
                                          keep_own=("kl_in_reward",)))
LM_ALGORITHMS.register("trpo", LMAlgorithm("grouprl.trainer.trpo:TRPOTrainer", "grouprl.trainer.trpo:TRPOConfig"))


def _import(path: str) -> Any:
    import importlib

    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def lm_algorithm_config(run: Any, algo: str, options: dict[str, Any]) -> Any:
    """The trainer config of ``algo``: the shared fields of ``run`` (a TrainConfig), then the
    algorithm's defining overrides, then the user's ``options`` for it."""
    spec = LM_ALGORITHMS.get(algo)
    config_cls = _import(spec.config)
    own = {f.name for f in fields(config_cls)}
    from grouprl.trainer.config import GRPOConfig

    shared = {f.name: getattr(run, f.name) for f in fields(GRPOConfig) if f.name not in spec.keep_own}
    unknown = set(options) - own
    if unknown:
        raise ValueError(f"algo_options.{algo}: {', '.join(sorted(unknown))} is not a {config_cls.__name__} option")
    return config_cls(**{**shared, **spec.overrides, **options})


def _train_lm(run: Any, algo: str, options: dict[str, Any], wall_budget_s: float | None) -> None:
    """Child process: train ``algo`` on the run config ``run`` and write its report."""
    from grouprl.cli.build import build_inputs, load_model
    from grouprl.config import to_dict
    from grouprl.report import write_report

    config = lm_algorithm_config(run, algo, options)
    inputs = build_inputs(run)
    policy, tokenizer = load_model(run.model, run.seed)
    trainer = _import(LM_ALGORITHMS.get(algo).trainer)(
        config, policy=policy, tokenizer=tokenizer, reward_fns=inputs.reward_fns, train_data=inputs.train_rows,
        eval_data=inputs.eval_rows or None, reward_weights=inputs.reward_weights, is_correct=inputs.is_correct,
        system_prompt=inputs.system_prompt, run_config={"algo": algo, "run": to_dict(run), "trainer": to_dict(config)})
    trainer.time_budget_s = wall_budget_s
    trainer.train()
    write_report(run.output_dir)


def _train_control(run: Any, algo: str, options: dict[str, Any], wall_budget_s: float | None) -> None:
    """Child process: train ``algo`` on the control config ``run`` and write its report."""
    from grouprl.report import write_report
    from grouprl.trainer.control import ControlTrainer

    trainer = ControlTrainer(replace(run, algo=algo))
    trainer.time_budget_s = wall_budget_s
    trainer.train()
    write_report(run.output_dir)


# --------------------------------------------------------------------------- orchestration


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
    """Train every (algorithm, seed) of ``compare`` on ``base`` (a TrainConfig, or a ControlConfig
    when ``compare.env`` is set), then write the table and plots. Returns comparison.md's path.

    Every algorithm's config is built (and so checked), and every run folder checked for an
    earlier run (replaced with ``overwrite``, refused otherwise), before the first run starts."""
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
    for folder in held:
        prepare_output_dir(folder, overwrite=True, echo=echo)
    (out / "compare_config.json").write_text(json.dumps(
        {"compare": dataclasses.asdict(compare), "base": _plain(base)}, indent=2, default=str))
    target = _train_control if compare.env else _train_lm
    for algo, seed, run in jobs:
        echo(f"compare: {algo} seed {seed} -> {run.output_dir}")
        _in_child(target, run, algo, compare.algo_options.get(algo, {}), compare.wall_budget_s)
    from grouprl.compare_report import summarize_runs, write_comparison  # matplotlib: only once there is a table

    runs = summarize_runs([(algo, seed, Path(run.output_dir)) for algo, seed, run in jobs], control=bool(compare.env))
    table = write_comparison(runs, out, control=bool(compare.env))
    echo(f"comparison: {table}")
    echo(f"plots: {out / 'plots'}")
    return table


def _plain(obj: Any) -> Any:
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj
