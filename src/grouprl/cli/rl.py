"""The ``grouprl rl`` and ``grouprl compare`` commands.

    grouprl rl --env CartPole-v1 --algo grpo|ppo|trpo|vpg [--key value ...]   classic control: run folder + report
    grouprl compare --algos grpo,rloo,ppo,trpo [--seeds 0,1] [train options]   language models, side by side
"""

from __future__ import annotations

import argparse
from typing import Any

from grouprl.cli.compare import CompareConfig
from grouprl.config import TrainConfig, add_dataclass_arguments, load_config, yaml_text

EXIT_OK = 0
RL_USAGE = "grouprl rl [--config YAML] [--env ID] [--algo grpo|ppo|trpo|vpg] [--key value ...]"
COMPARE_USAGE = "grouprl compare [--algos A,B,...] [--seeds 0,1,...] [--env ID] [--config YAML] [--key value ...]"


def _gymnasium_or_explain() -> None:
    try:
        import gymnasium  # noqa: F401
    except ImportError:
        raise ValueError("classic control needs gymnasium: pip install 'grouprl[rl]'") from None


def _common(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    parser.add_argument("--config", metavar="YAML", help=f"YAML file of {what} keys (the command line wins over it)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace earlier runs in the output folder (logs, checkpoints, report), not refuse")


def register(subparsers: Any) -> None:
    """Add the ``rl`` and ``compare`` subcommands to ``grouprl``'s subparsers."""
    try:
        from grouprl.control.config import ControlConfig
    except ImportError:  # gymnasium is an optional extra: the command then explains how to get it
        ControlConfig = None

    rl = subparsers.add_parser(
        "rl", help="GRPO, PPO, TRPO or VPG on a classic-control environment",
        description="Train an MLP policy on a gymnasium environment (CartPole-v1, Acrobot-v1, Pendulum-v1) with "
        "GRPO, PPO, TRPO or VPG: a run folder with config, metrics, checkpoints and report/report.html, the same "
        "as grouprl train's.", usage=RL_USAGE, allow_abbrev=False)
    _common(rl, "rl")
    if ControlConfig is not None:
        add_dataclass_arguments(rl, ControlConfig)
    rl.set_defaults(handler=_rl)

    compare = subparsers.add_parser(
        "compare", help="several algorithms on the same task, model, seeds and budget",
        description="Train each algorithm of --algos once per seed on the same settings, each in its own process, "
        "and write comparison.md (table) and plots/ (held-out metric and reward vs step and wall time, KL, peak "
        "memory, throughput). Without --env every grouprl train option applies (model, task, total_steps...); "
        "with --env every grouprl rl option does (total_env_steps, stop_at_return...).", usage=COMPARE_USAGE,
        allow_abbrev=False)
    _common(compare, "train (or, with --env, rl)")
    add_dataclass_arguments(compare, CompareConfig, dest="compare_overrides", title="comparison options")
    compare.set_defaults(handler=_compare)


def _print(config: Any) -> int:
    print(yaml_text(config), end="")
    return EXIT_OK


def _rl(args: argparse.Namespace, rest: list[str]) -> int:
    _gymnasium_or_explain()
    from grouprl.control.config import ControlConfig

    config = load_config(ControlConfig, args.config, [*args.overrides, *rest])
    if args.print_config:
        return _print(config)
    from grouprl.control.training import ControlTrainer
    from grouprl.report import write_report
    from grouprl.run.folder import claimed

    with claimed(config, overwrite=args.overwrite) as config:
        summary = ControlTrainer(config).train()
    report = write_report(config.output_dir)
    after = summary["eval_after"].get("eval/mean_reward")
    print(f"run folder: {config.output_dir}")
    print(f"report: {report}")
    solved = summary["solved_at_env_steps"]
    print(f"{config.algo} on {config.env}: {summary['env_steps']} env steps, eval mean return {after:.1f}"
          + ("" if solved is None else f", reached {config.stop_at_return} at {solved} env steps"))
    return EXIT_OK


def _compare(args: argparse.Namespace, rest: list[str]) -> int:
    compare = load_config(CompareConfig, None, args.compare_overrides)
    if compare.env:
        _gymnasium_or_explain()
        from grouprl.control.config import ControlConfig

        base = load_config(ControlConfig, args.config, [*rest, f"--env={compare.env}"])
    else:
        base = load_config(TrainConfig, args.config, rest)
    if args.print_config:
        _print(compare)
        return _print(base)
    if isinstance(base, TrainConfig):  # language models: their runs (child processes) inherit the allocator
        from grouprl.run.allocator import restart_command

        restart_command(base.allocator, args.is_program)
    from grouprl.cli.compare import run_compare

    run_compare(compare, base, overwrite=args.overwrite)
    return EXIT_OK
