"""The ``grouprl`` command line (also ``python -m grouprl``).

    grouprl train [--config run.yaml] [--key value ...]   train with GRPO, write a run folder and its report
    grouprl demo [--quick | --agent]                      the default model learns arithmetic (or a multi-turn
                                                          game); prints before/after
    grouprl eval --model PATH [--task NAME] [--samples K]  held-out accuracy, pass@k, mean reward
    grouprl report RUN_DIR                                (re)write a run's plots and report.html
    grouprl train-rm --pairs pairs.jsonl [...]            fit a reward model to preference pairs

Every config key is a ``--key`` option; values resolve as defaults < YAML file < command line. Bad input ends
with exit status 2 and a one-paragraph message (``--debug``: the traceback); an unexpected failure with 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from grouprl.cli.help import add_section_help
from grouprl.cli.phases import announce, resolved_line
from grouprl.config import (
    ConfigError,
    RewardModelConfig,
    TrainConfig,
    add_dataclass_arguments,
    apply_overrides,
    from_dict,
    load_config,
    to_dict,
    yaml_text,
)
from grouprl.config.sections import DISTRIBUTION, RUN_FOLDER, SECTION_NOTES, SECTIONS
from grouprl.errors import DistributedError, Interrupted, ModelLoadError, NonFiniteError, RewardFunctionError

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
VALUES = ("Values: a list is one argument, a,b,c or YAML's '[a, b]' (quoted), never space-separated; a mapping is "
          "YAML, '{digits: 2}'; a flag is --key, --no-key or --key false; none (or '') empties an optional key.")
EXAMPLE = ("example (a random tiny model, one step; --dataset prompts.jsonl instead of --task for your own "
           "prompts): grouprl train --model tiny --task countdown --reward_functions exact_match,format "
           "--total_steps 1 --output_dir runs/try")
EVAL_OPTIONS = ("model", "task", "task_options", "dataset", "dataset_config", "eval_dataset", "eval_split",
                "prompt_column", "answer_column", "env", "env_options", "tools", "eval_size", "eval_samples",
                "eval_temperature", "max_new_tokens", "reward_functions", "seed")
"""The keys ``grouprl eval --help`` lists; every other train key is accepted too."""


def _bad_input_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean the input was wrong, not the program (a TypeError outside the config checks is a bug)."""
    return ValueError, OSError, ModelLoadError, RewardFunctionError, DistributedError


class _Formatter(argparse.HelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)


class _RawFormatter(_Formatter, argparse.RawDescriptionHelpFormatter):
    """Keeps the module docstring's command table as written."""


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")


def _with_config(parser: argparse.ArgumentParser, what: str) -> None:
    _common(parser)
    parser.add_argument("--config", metavar="YAML", help=f"YAML file of {what} keys (the command line wins over it)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config as YAML and exit without loading anything")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grouprl", description=__doc__, formatter_class=_RawFormatter,
                                     allow_abbrev=False)
    _common(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, help_text: str, description: str, usage: str, epilog: str | None = None,
            sectioned: bool = False) -> argparse.ArgumentParser:
        # allow_abbrev=False: --group must not silently mean --group_size; the usage line is given, not every option
        command = sub.add_parser(name, help=help_text, description=description, formatter_class=_Formatter,
                                 allow_abbrev=False, usage=f"grouprl {name} {usage}", epilog=epilog,
                                 add_help=not sectioned)
        if sectioned:
            add_section_help(command)
        return command

    train = add("train", "train a policy with GRPO", "Train a policy with GRPO: a run folder with the resolved "
                "config, metrics, completions, checkpoints and report/report.html. " + VALUES,
                "[--config YAML] [--key value ...]", epilog=EXAMPLE, sectioned=True)
    _with_config(train, "train")
    groups = add_dataclass_arguments(train, TrainConfig, sections=SECTIONS, notes=SECTION_NOTES)
    groups[RUN_FOLDER].add_argument("--overwrite", action="store_true", help="replace an earlier run in output_dir "
                                    "(logs, checkpoints, report) instead of refusing")
    groups[DISTRIBUTION].add_argument("--nproc", type=int, default=1, metavar="N", help="train in N processes on "
                                      "this machine (runs torchrun for you; engine picks FSDP2 or DDP)")
    train.set_defaults(handler=_train)

    demo = add("demo", "the default model learns one-digit arithmetic on a CPU, in minutes",
               "SmolLM2-135M-Instruct learns one-digit arithmetic with GRPO; held-out accuracy is measured "
               "before and after, and the last line reads 'accuracy before=... after=...'. Any train option "
               "overrides the demo's settings. " + VALUES, "[--quick] [--key value ...]",
               sectioned=True)
    _with_config(demo, "train")
    kind = demo.add_mutually_exclusive_group()
    kind.add_argument("--quick", action="store_true", help="a tiny random model on a trivial task, in under a minute")
    kind.add_argument("--agent", action="store_true",
                      help="the default model learns a multi-turn guessing game; the last line reads "
                           "'success before=... after=...'")
    from grouprl.config.options import describe_fields

    # the demo's --agent is its guessing game; the agent key still works from a --config file
    add_dataclass_arguments(demo, TrainConfig, sections=SECTIONS, notes=SECTION_NOTES,
                            keys=[r.key for r in describe_fields(TrainConfig) if r.key != "agent"])
    demo.set_defaults(handler=_demo)

    evaluate = add("eval", "held-out accuracy, pass@k and mean reward of a model",
                   "Evaluate a model (a bundled name, a model folder, or a run or checkpoint folder: its newest "
                   "policy) on the held-out prompts of a task or dataset. A run folder (or one of its "
                   "checkpoints) given alone brings its run's config.yaml: its held-out prompts, rewards and "
                   "sampling, so the final checkpoint scores as the run reported (as --config "
                   "runs/X/config.yaml does). Every train key is accepted; the ones that matter are listed. "
                   + VALUES,
                   "--model PATH [--task NAME | --dataset FILE] [--samples K] [--key value ...]")
    _with_config(evaluate, "train")
    add_dataclass_arguments(evaluate, TrainConfig, keys=EVAL_OPTIONS, aliases={"samples": "eval_samples"},
                            sections=SECTIONS)
    evaluate.set_defaults(handler=_eval)

    report = add("report", "(re)write a run's plots and report.html", "Write RUN_DIR/report/: PNG plots and "
                 "report.html from metrics.jsonl, completions.jsonl and config.yaml (also works mid-run).", "RUN_DIR")
    _common(report)
    report.add_argument("run_dir", metavar="RUN_DIR", help="the run folder (a train run's output_dir)")
    report.set_defaults(handler=_report)

    train_rm = add("train-rm", "fit a reward model to preference pairs", "Fit a reward model (Bradley-Terry "
                   "loss) to preference pairs {prompt, chosen, rejected}; use it with train --reward_model.",
                   "--pairs FILE [--model NAME] [--output_dir DIR] [--key value ...]")
    _with_config(train_rm, "train-rm")
    add_dataclass_arguments(train_rm, RewardModelConfig)
    train_rm.set_defaults(handler=_train_rm)
    from grouprl.cli.rl import register as register_rl  # rl (classic control) and compare

    register_rl(sub)
    from grouprl.cli.serve import register as register_serve  # rollout servers

    register_serve(sub)
    return parser


def _resolve(args: argparse.Namespace, rest: list[str], cls: type, base: dict[str, Any] | None = None) -> Any:
    """defaults < ``base`` (a demo's) < --config < command line with ``rest``, the options argparse did not know."""
    overrides = [*args.overrides, *rest]
    if base is None:
        return load_config(cls, args.config, overrides)
    from grouprl.config import read_yaml_mapping

    data = {**base, **(read_yaml_mapping(args.config) if args.config else {})}
    return from_dict(cls, apply_overrides(data, overrides, cls))


def _restart_with_allocator(args: argparse.Namespace, config: TrainConfig) -> None:
    """The command again under ``config.allocator``'s pick; the process that goes on says the config is resolved."""
    from grouprl.run.allocator import restart_command

    restart_command(config.allocator, args.is_program)
    announce(resolved_line(config))


def _print_config(config: Any) -> int:
    print(yaml_text(config), end="")
    return EXIT_OK


def _train(args: argparse.Namespace, rest: list[str]) -> int:
    config = _resolve(args, rest, TrainConfig)
    if args.print_config:
        return _print_config(config)
    _restart_with_allocator(args, config)
    from grouprl.cli.commands import train
    from grouprl.trainer.dist.group import torchrun_world_size

    if args.nproc != 1 and torchrun_world_size() == 1:  # under torchrun the world size is torchrun's
        from grouprl.cli.launch import launch
        from grouprl.run.folder import claimed

        with claimed(config, overwrite=args.overwrite) as config:  # held here for every process of the run
            return launch(config, args.nproc)
    train(config, overwrite=args.overwrite)
    return EXIT_OK


def _demo(args: argparse.Namespace, rest: list[str]) -> int:
    from grouprl.cli.demo import AGENT_DEMO, DEMO, QUICK_DEMO, QUICK_DEMO_NOTE, agent_demo_note, demo_note

    settings = QUICK_DEMO if args.quick else AGENT_DEMO if args.agent else DEMO
    config = _resolve(args, rest, TrainConfig, base=settings)
    if args.print_config:
        return _print_config(config)
    _restart_with_allocator(args, config)
    from grouprl.cli.commands import train

    note = QUICK_DEMO_NOTE if args.quick else agent_demo_note if args.agent else demo_note
    print(note if isinstance(note, str) else note(to_dict(config)), flush=True)
    train(config, overwrite=True)  # a demo run again starts afresh; its last line is "accuracy before=... after=..."
    return EXIT_OK


PROMPT_SOURCES = frozenset({"task", "dataset", "eval_dataset", "env"})  # where eval's held-out prompts come from


def _eval(args: argparse.Namespace, rest: list[str]) -> int:
    """``grouprl eval``; a run or checkpoint folder alone brings its run's config.yaml."""
    from grouprl.cli.build import run_config_of

    config = _resolve(args, rest, TrainConfig)
    given = {a[2:].split("=")[0] for a in [*args.overrides, *rest] if a.startswith("--")}
    run_config = None if args.config or given & PROMPT_SOURCES else run_config_of(config.model)
    if run_config is not None:  # which may be from an earlier release
        from grouprl.config import read_yaml_mapping
        from grouprl.config.fields import without_retired

        saved = without_retired(TrainConfig, read_yaml_mapping(run_config), str(run_config))
        config = _resolve(args, rest, TrainConfig, base=saved)
    if args.print_config:
        return _print_config(config)
    _restart_with_allocator(args, config)
    from grouprl.cli import commands

    if run_config is not None:
        print(f"held-out prompts, rewards and sampling of the run: {run_config} (--task or --dataset to "
              "evaluate on others)", flush=True)
    commands.evaluate_command(config)
    return EXIT_OK


def _train_rm(args: argparse.Namespace, rest: list[str]) -> int:
    config = _resolve(args, rest, RewardModelConfig)
    if args.print_config:
        return _print_config(config)
    from grouprl.cli.commands import train_rm_command  # imported only now: it pulls in torch

    train_rm_command(config)
    return EXIT_OK


def _report(args: argparse.Namespace, rest: list[str]) -> int:
    if rest:
        raise ConfigError(f"grouprl report takes one run folder and no options; got extra {' '.join(rest)!r}")
    from grouprl.cli.commands import report_command

    report_command(args.run_dir)
    return EXIT_OK


def error_paragraph(error: BaseException) -> str:
    """The error as one paragraph: its lines kept (a pip command reads better on its own), blank lines dropped."""
    text = str(error).strip() or type(error).__name__
    return "\n".join(line for line in text.splitlines() if line.strip())


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status."""
    is_program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        args, rest = build_parser().parse_known_args(argv)
        args.is_program = is_program
        handler: Callable[[argparse.Namespace, list[str]], int] = args.handler
        return handler(args, rest)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2), already printed
        return e.code if isinstance(e.code, int) else EXIT_BAD_INPUT
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM as Interrupted (grouprl.run.signals): 128 + its number
        why = f" ({e})" if isinstance(e, Interrupted) and str(e) else ""
        print(f"grouprl: interrupted{why}; checkpoints and logs written so far are kept", file=sys.stderr)
        return 128 + e.signum if isinstance(e, Interrupted) else EXIT_INTERRUPTED
    except Exception as e:
        if debug:
            raise
        if isinstance(e, _bad_input_errors()):
            print(f"grouprl: error: {error_paragraph(e)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if isinstance(e, NonFiniteError):  # the run diverged: not a bug, and said in full
            print(f"grouprl: error: {error_paragraph(e)}", file=sys.stderr)
            return EXIT_FAILURE
        print(f"grouprl: unexpected {type(e).__name__}: {error_paragraph(e)} (run again with --debug for the "
              "traceback)", file=sys.stderr)
        return EXIT_FAILURE
