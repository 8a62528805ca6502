"""The one builder: from a :class:`~grouprl.config.TrainConfig` to a trainer (prompt rows, reward functions, the
accuracy checker, the model, the process group). Everything cheap that can be wrong is checked before the model
loads: a typo costs seconds."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grouprl.config import DEFAULT_TASK_EVAL_SIZE, DEFAULT_TASK_TRAIN_SIZE, TINY_MODEL, TrainConfig, check
from grouprl.data.prompt_sets import ANSWER
from grouprl.errors import ConfigError, ModelLoadError
from grouprl.registry import import_object
from grouprl.trainer.inputs import RunInputs

Row = dict[str, Any]
EVAL_RESET_BASE = 1_000_000
"""Held-out resets of an environment are seeded from here on; training resets count from 0."""


def load_rows(config: TrainConfig) -> tuple[list[Row], list[Row], Any, dict[int, str]]:
    """(train rows, eval rows, task or None, each file row's place by ``id(row)``); an environment's rows are seeds."""
    if config.env and not config.dataset:
        n_eval = DEFAULT_TASK_EVAL_SIZE if config.eval_size is None else config.eval_size
        return ([{"seed": i} for i in range(config.train_size or DEFAULT_TASK_TRAIN_SIZE)],
                [{"seed": EVAL_RESET_BASE + i} for i in range(n_eval)], None, {})
    if config.task:
        task = config.build_task()
        train = task.rows("train", config.train_size or DEFAULT_TASK_TRAIN_SIZE, config.seed)
        n_eval = DEFAULT_TASK_EVAL_SIZE if config.eval_size is None else config.eval_size
        return train, task.rows("eval", n_eval, config.seed), task, {}
    from grouprl.data import config_problem, load_prompts, row_places, train_eval_split

    def read(source: str, split: str | None) -> list[Row]:
        # dataset_config names a config of dataset; a separate eval_dataset takes it only if it has configs too
        name = config.dataset_config if config_problem(source, config.dataset_config) is None else None
        rows = load_prompts(source, config.prompt_column, split=split, config=name, answer_column=config.answer_column)
        places.update(zip(map(id, rows), row_places(source, len(rows), split), strict=True))
        return rows

    places: dict[int, str] = {}
    rows = read(config.dataset, config.dataset_split)
    if config.eval_dataset or config.eval_split:
        train = rows
        held = [] if config.eval_size == 0 else read(config.eval_dataset or config.dataset,
                                                     config.eval_split or config.dataset_split)
        held = held[: config.eval_size] if config.eval_size else held
    elif config.eval_size == 0 or (config.eval_size is None and config.eval_fraction == 0):
        train, held = rows, []
    elif config.eval_size is not None:
        train, held = train_eval_split(rows, eval_size=config.eval_size, seed=config.seed)
    else:
        train, held = train_eval_split(rows, eval_fraction=config.eval_fraction, seed=config.seed)
    return train[: config.train_size] if config.train_size else train, held, None, places


def load_reward_fns(config: TrainConfig, task: Any) -> tuple[list[Callable[..., Any]], list[float]]:
    """The configured reward functions (the task's when none are listed), then the reward model."""
    from grouprl.rewards.remote import RemoteReward, is_url, remote_settings

    if config.reward_functions:
        fns = []
        for name in config.reward_functions:
            options = config.reward_options.get(name)
            if is_url(name):
                fns.append(RemoteReward(name, batch_size=config.remote_reward_batch_size, **remote_settings(config)))
                continue
            if ":" not in name:
                fns.append(config.builtin_reward(name))  # made (and checked) by the config's validation
                continue
            fn = import_object(name, "reward function")
            if options is not None:  # with options, the import path names a factory
                try:
                    fn = fn(**options)
                except TypeError as e:
                    raise ConfigError(f"reward function {name!r} does not take the options {options}: {e}") from e
            if not callable(fn):
                raise ConfigError(f"reward function {name!r} is a {type(fn).__name__}, not a callable")
            fns.append(fn)
        weights = [1.0] * len(fns)
    elif task is not None:
        fns, weights = list(task.reward_fns), list(task.reward_weights)
    else:
        fns, weights = [], []
    if config.reward_model:
        from grouprl.rewards.reward_model import RewardModel

        fns.append(RewardModel(config.reward_model, system_prompt=config.system_prompt))
        weights.append(1.0)
    return fns, list(config.reward_weights) if config.reward_weights else weights


def answer_checker(completion: str, row: Row) -> bool:
    """Whether the completion's final answer equals the row's gold ``answer``, as numbers or as math."""
    from grouprl.rewards.answers import answer_is_correct

    gold = row.get(ANSWER)
    return gold is not None and answer_is_correct(completion, gold)


MATH_REWARDS = frozenset({"math_equivalence", "accuracy", "exact_match"})  # they compare with the gold answer


def check_gold_answers(config: TrainConfig, rows: list[Row], places: dict[int, str], checked: bool) -> None:
    """Warn when some gold answers of ``rows`` give no answer (those rows can never score), fail when none does
    (most likely the wrong column); only where a math reward or (``checked``) the default checker reads them."""
    if not rows or ANSWER not in rows[0] or not (checked or MATH_REWARDS & set(config.reward_functions)):
        return
    from grouprl.data import DataError
    from grouprl.rewards.answers import check_golds, gold_answer

    values = [row.get(ANSWER) for row in rows]
    bad, example = check_golds(values)
    if not bad:
        return
    at = next(i for i, v in enumerate(values) if gold_answer(v) is None)
    where = f" at {places.get(id(rows[at]), f'row {at}')}"
    message = (f"{bad} of {len(values)} gold answers in answer_column {config.answer_column!r} of {config.dataset} "
               f"give no answer to compare with (e.g.{where}: {example})")
    if bad == len(values):
        raise DataError(f"{message}: none does, so no completion could ever be scored right; is answer_column the "
                        "column of gold answers (a number, GSM8K's '... #### 72', a MATH solution with \\boxed{})?")
    warnings.warn(f"{message}: completions for those rows always score 0", stacklevel=2)


def check_renamed_answer(config: TrainConfig, fns: list[Callable[..., Any]]) -> None:
    """A reward function that asks for the answer column by the name ``answer_column`` renamed is told so."""
    import inspect

    from grouprl.rewards import reward_name

    if not config.dataset or config.answer_column == ANSWER:
        return
    for fn in fns:
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            continue
        if config.answer_column in params:
            raise ConfigError(f"reward function {reward_name(fn)!r} takes {config.answer_column!r}, the column that "
                              f"answer_column renames to 'answer': name that parameter answer")


def load_checker(config: TrainConfig, task: Any, eval_rows: list[Row]) -> Callable[[str, Row], bool] | None:
    if config.accuracy_fn:
        fn = import_object(config.accuracy_fn, "accuracy_fn")
        if not callable(fn):
            raise ConfigError(f"accuracy_fn {config.accuracy_fn!r} is a {type(fn).__name__}, not a callable")
        return fn
    if task is not None:
        return task.is_correct
    return answer_checker if eval_rows and ANSWER in eval_rows[0] else None


def build_inputs(config: TrainConfig) -> RunInputs:
    """Prompts (or resets), rewards, checker, environment and tools for ``config``, checked before any model loads."""
    check(config)
    train, held, task, places = load_rows(config)
    checker = None if config.env else load_checker(config, task, held)
    if task is None and config.dataset:
        check_gold_answers(config, [*train, *held], places, checked=checker is answer_checker)
    fns, weights = load_reward_fns(config, task)
    check_renamed_answer(config, fns)
    env, tools = None, []
    if config.env or config.tools:
        from grouprl.envs.factory import env_tools, make_env_factory
        from grouprl.envs.tools import load_tools, resolve_tool_parser

        resolve_tool_parser(config.tool_parser)
        tools = load_tools(list(config.tools))
        if config.env:
            env = make_env_factory(config.env, config.env_options)
            tools += env_tools(env)  # the tools the environment brings
    agent = import_object(config.agent, "agent") if config.agent else None
    if agent is not None and not callable(agent):
        raise ConfigError(f"agent {config.agent!r} is a {type(agent).__name__}, not a function (client, row)")
    judge = None
    if config.judge:
        from grouprl.rewards.judges import load_judge
        from grouprl.rewards.remote import is_url, remote_settings

        options = {**remote_settings(config), **config.judge_options} if is_url(config.judge) else config.judge_options
        judge = load_judge(config.judge, options, load_model=lambda name: load_model(name, config.seed))
    if train and "prompt" in train[0]:
        from grouprl.rewards.remote import probe

        probe(fns, judge, train[0])
    return RunInputs(train_rows=train, eval_rows=held, reward_fns=fns, reward_weights=weights,
                     judge=judge, judge_weight=config.judge_weight,
                     is_correct=checker,
                     system_prompt=task.system_prompt if task is not None else None, env=env, tools=tools, agent=agent,
                     train_places=[places[id(r)] for r in train] if places else [],
                     eval_places=[places[id(r)] for r in held] if places else [], distilled=config.distill_coef > 0)


def resolve_model_path(spec: str) -> str:
    """A run or checkpoint folder stands for the policy it saved last, once its files match the manifest;
    anything else is passed on unchanged. A run folder without a complete checkpoint is a :class:`ModelLoadError`."""
    from grouprl.run.checkpoint_files import latest_complete, verify_checkpoint

    path = Path(spec).expanduser()
    if (path / "state.json").is_file() and (path / "model").is_dir():
        verify_checkpoint(path)
        return str(path / "model")
    if not path.is_dir() or not ((path / "checkpoints").is_dir() or (path / "metrics.jsonl").is_file()):
        return spec
    found = latest_complete(path / "checkpoints", warn=lambda message: warnings.warn(message, stacklevel=3))
    if found is None:
        raise ModelLoadError(f"{spec!r} is a run folder without a complete checkpoint (nothing under "
                             f"{path / 'checkpoints'}), so it holds no policy to load; pass a model or a "
                             "checkpoint folder, or let the run reach its first save_every")
    verify_checkpoint(found)
    return str(found / "model")


EVAL_PICKS = 5
"""How often ``grouprl eval`` of a run folder picks again when the training run removed the checkpoint picked."""


def load_newest_model(spec: str, seed: int, echo: Callable[[str], None] = print) -> tuple[Any, Any]:
    """:func:`load_model` for ``grouprl eval``: a run still training may remove the checkpoint just picked, so the
    newest is picked again (``echo`` says so), up to :data:`EVAL_PICKS` times."""
    from grouprl.run.checkpoint_files import latest_complete, verify_checkpoint

    run = Path(spec).expanduser()
    if (run / "state.json").is_file() or not (run.is_dir() and (run / "checkpoints").is_dir()):
        return load_model(spec, seed)  # a model, or one checkpoint named by its folder: nothing to pick
    for _ in range(EVAL_PICKS):
        picked = latest_complete(run / "checkpoints", warn=lambda message: warnings.warn(message, stacklevel=3))
        if picked is None:
            resolve_model_path(spec)  # says there is no complete checkpoint
        try:
            verify_checkpoint(picked)
            return load_model(str(picked / "model"), seed)
        except (OSError, ValueError, ModelLoadError) as e:  # CheckpointError is a ValueError
            if picked.exists():
                raise
            echo(f"{picked.name} was removed by the training run while it was being read ({type(e).__name__}); "
                 "picking the newest checkpoint again")
    raise ModelLoadError(f"{spec!r}: the training run removed each of the last {EVAL_PICKS} checkpoints picked "
                         "before it could be read (it keeps only keep_checkpoints); evaluate a copy of a checkpoint "
                         "folder, or run eval once the training has saved its last")


def run_config_of(spec: str) -> Path | None:
    """The ``config.yaml`` of the run that a run folder or one of its checkpoint folders belongs to."""
    path = Path(spec).expanduser()
    if (path / "state.json").is_file() and (path / "model").is_dir():
        path = path.parent.parent  # RUN/checkpoints/step-N
    is_run = path.is_dir() and ((path / "checkpoints").is_dir() or (path / "metrics.jsonl").is_file())
    return path / "config.yaml" if is_run and (path / "config.yaml").is_file() else None


def load_model(spec: str, seed: int) -> tuple[Any, Any]:
    """(policy, tokenizer) for a ``model`` config value; ``tiny`` is a random 2-layer model."""
    from grouprl.models import load_policy, tiny_causal_lm

    if spec == TINY_MODEL:
        return tiny_causal_lm(seed=seed)
    return load_policy(resolve_model_path(spec))


def build_trainer(config: TrainConfig, inputs: RunInputs, policy: Any, tokenizer: Any, env: Any = None,
                  run_config: TrainConfig | None = None) -> Any:
    """The trainer for ``config``, in one process or torchrun's ``env``; ``run_config`` is what config.yaml records."""
    from grouprl.trainer.teacher import is_server
    from grouprl.trainer.trainer import Trainer

    processes = None
    if env is not None:
        from grouprl.trainer.dist.processes import Processes

        processes = Processes(env, config)
    teacher, teacher_tokenizer = None, None
    if config.distill_coef and not is_server(config.teacher_model):  # tiny: another seed than the policy's
        teacher, teacher_tokenizer = load_model(config.teacher_model, config.seed + 1)
    return Trainer(config, policy=policy, tokenizer=tokenizer, inputs=inputs,
                   run_config=run_config if run_config is not None else config, processes=processes,
                   teacher=teacher, teacher_tokenizer=teacher_tokenizer)
