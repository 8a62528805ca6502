"""From a :class:`~grouprl.config.TrainConfig` to what the trainer takes: prompt rows, reward
functions and weights, the accuracy checker and the model.

The order is the point: everything cheap that can be wrong (files, columns, imports of the user's
reward functions) is checked before the model, the expensive part, is loaded, so a typo costs
seconds rather than a model load.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grouprl.config import DEFAULT_TASK_EVAL_SIZE, DEFAULT_TASK_TRAIN_SIZE, TINY_MODEL, ConfigError, TrainConfig

Row = dict[str, Any]


@dataclass
class RunInputs:
    """Everything a trainer needs besides the model."""

    train_rows: list[Row]
    eval_rows: list[Row]
    reward_fns: list[Callable[..., Any]]
    reward_weights: list[float]
    is_correct: Callable[[str, Row], bool] | None
    system_prompt: str | None
    """The task's system prompt (the config's system_prompt, if set, wins inside the trainer)."""


# --------------------------------------------------------------------------- user code by import path


def import_object(path: str, what: str) -> Any:
    """The object named by ``module:attr`` or ``path/to/file.py:attr``.

    A dotted module is looked up from the current folder first, as ``python -m`` would: the
    ``grouprl`` console script does not put the current folder on ``sys.path`` by itself.
    """
    module_name, _, attr = path.rpartition(":")
    try:
        module = _import_file(module_name) if module_name.endswith(".py") else _import_module(module_name)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure while importing user code is reported with its cause
        raise ConfigError(f"{what} {path!r}: importing {module_name!r} failed with {type(e).__name__}: {e}") from e
    if not hasattr(module, attr):
        public = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise ConfigError(f"{what} {path!r}: {module_name!r} has no attribute {attr!r}; "
                          f"its callables: {', '.join(public) or 'none'}")
    return getattr(module, attr)


def _import_file(filename: str) -> Any:
    file = Path(filename).expanduser()
    if not file.is_file():
        raise ConfigError(f"{filename!r} does not exist (import paths are file.py:function or module:function)")
    digest = hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:10]
    name = f"grouprl_user_{file.stem}_{digest}"  # one module per file, however it is spelt
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up here
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _import_module(name: str) -> Any:
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    finally:
        if added:
            sys.path.remove(cwd)


# --------------------------------------------------------------------------- prompts


def load_rows(config: TrainConfig) -> tuple[list[Row], list[Row], Any]:
    """(train rows, eval rows, the task object or None) for a task or a dataset."""
    if config.task:
        task = config.build_task()
        train = task.rows("train", config.train_size or DEFAULT_TASK_TRAIN_SIZE, config.seed)
        n_eval = DEFAULT_TASK_EVAL_SIZE if config.eval_size is None else config.eval_size
        return train, task.rows("eval", n_eval, config.seed), task
    from grouprl.data import load_prompts, train_eval_split

    rows = load_prompts(config.dataset, config.prompt_column, split=config.dataset_split)
    if config.eval_dataset:
        train, held = rows, load_prompts(config.eval_dataset, config.prompt_column, split=config.dataset_split)
    elif config.eval_size == 0 or (config.eval_size is None and config.eval_fraction == 0):
        train, held = rows, []
    elif config.eval_size is not None:
        train, held = train_eval_split(rows, eval_size=config.eval_size, seed=config.seed)
    else:
        train, held = train_eval_split(rows, eval_fraction=config.eval_fraction, seed=config.seed)
    return train[: config.train_size] if config.train_size else train, held, None


# --------------------------------------------------------------------------- rewards and the checker


def load_reward_fns(config: TrainConfig, task: Any) -> tuple[list[Callable[..., Any]], list[float]]:
    """The configured reward functions (the task's when none are listed), then the reward model."""
    from grouprl.rewards import make_reward

    if config.reward_functions:
        fns = []
        for name in config.reward_functions:
            options = config.reward_options.get(name)
            if ":" not in name:
                fns.append(make_reward(name, **(options or {})))
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
    """Exact match of the completion's final answer against the row's ``answer`` column."""
    from grouprl.rewards.builtin import answers_match, extract_answer

    gold = row.get("answer")
    return gold is not None and answers_match(extract_answer(completion), gold)


def load_checker(config: TrainConfig, task: Any, eval_rows: list[Row]) -> Callable[[str, Row], bool] | None:
    if config.accuracy_fn:
        fn = import_object(config.accuracy_fn, "accuracy_fn")
        if not callable(fn):
            raise ConfigError(f"accuracy_fn {config.accuracy_fn!r} is a {type(fn).__name__}, not a callable")
        return fn
    if task is not None:
        return task.is_correct
    return answer_checker if eval_rows and "answer" in eval_rows[0] else None


def build_inputs(config: TrainConfig) -> RunInputs:
    """Prompts, rewards and checker for ``config``; fails on a reward function that needs a column
    the data lacks, before any model is loaded."""
    from grouprl.rewards import check_reward_columns

    train, held, task = load_rows(config)
    fns, weights = load_reward_fns(config, task)
    if train:
        check_reward_columns(fns, [k for k in train[0] if k != "prompt"])
    return RunInputs(train_rows=train, eval_rows=held, reward_fns=fns, reward_weights=weights,
                     is_correct=load_checker(config, task, held),
                     system_prompt=task.system_prompt if task is not None else None)


# --------------------------------------------------------------------------- the model


def resolve_model_path(spec: str) -> str:
    """A run folder or a checkpoint folder stands for the policy it saved last; anything else is
    passed on unchanged (bundled name, model folder, .gguf file, Hugging Face id)."""
    from grouprl.trainer.checkpoint import checkpoint_dirs

    path = Path(spec).expanduser()
    if (path / "state.json").is_file() and (path / "model").is_dir():
        return str(path / "model")
    found = checkpoint_dirs(path / "checkpoints") if path.is_dir() else []
    return str(found[-1] / "model") if found else spec


def load_model(spec: str, seed: int) -> tuple[Any, Any]:
    """(policy, tokenizer) for a ``model`` config value; ``tiny`` is a random 2-layer model."""
    from grouprl.models import load_policy, tiny_causal_lm

    if spec == TINY_MODEL:
        return tiny_causal_lm(seed=seed)
    return load_policy(resolve_model_path(spec))
