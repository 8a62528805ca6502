"""Checking a config before anything is loaded or any user code imported: :func:`check` refuses a trainer's or a
run's config that cannot run, naming every key at fault. The registries import torch, so they are imported only
when a check runs."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from grouprl.config.train_config import TrainConfig, is_import_path

if TYPE_CHECKING:
    from grouprl.trainer.config import TrainerConfig


def check(config: TrainerConfig) -> None:
    """Raise :class:`ConfigError` naming every problem of ``config`` (an unknown name with the closest valid ones)."""
    from grouprl.trainer.checks import check as check_trainer

    check_trainer(config, *([_run_problems] if isinstance(config, TrainConfig) else []))


def _run_problems(c: TrainConfig) -> list[str]:
    from grouprl.run.allocator import resolve

    out = _source_problems(c) + _size_problems(c) + _reward_problems(c)
    try:
        resolve(c.allocator)  # a name not installed, or a path that is no file, is refused here
    except ValueError as e:
        out.append(str(e))
    return out


def _source_problems(c: TrainConfig) -> list[str]:
    from grouprl.tasks import TASKS

    agent = _agent_problems(c)
    if agent:
        return agent
    if c.dataset:
        if c.task_options:
            return ["task_options apply to a built-in task, but dataset is set: remove task_options"]
        from grouprl.data import missing_file

        missing = [f"{key}: {m}" for key in ("dataset", "eval_dataset") if (m := missing_file(getattr(c, key) or ""))]
        return missing[:1] or _split_problems(c)  # the file comes first: what else is wrong may depend on its columns
    dataset_only = {"dataset_config": c.dataset_config, "dataset_split": c.dataset_split, "eval_split": c.eval_split,
                    "eval_dataset": c.eval_dataset,
                    "prompt_column": None if c.prompt_column == "prompt" else c.prompt_column,
                    "answer_column": None if c.answer_column == "answer" else c.answer_column}
    stray = [k for k, v in dataset_only.items() if v is not None]
    if stray:
        return [f"{', '.join(stray)} apply to a dataset, but no dataset is set"]
    if c.env:
        return []
    if not c.task:
        return [f"nothing to train on: set task (one of {', '.join(TASKS.names())}), dataset (a prompt file) or "
                "env (an environment)"]
    TASKS.get(c.task)  # unknown names fail here with the closest valid ones
    c.build_task()  # bad task options fail here, naming the valid ones
    return []


def _split_problems(c: TrainConfig) -> list[str]:
    from grouprl.data.hub import config_problem, split_problem

    problems = [config_problem(c.dataset, c.dataset_config),
                split_problem(c.dataset, "dataset_split", c.dataset_split),
                split_problem(c.eval_dataset or c.dataset, "eval_split", c.eval_split)]
    if any(problems):
        return [p for p in problems if p][:1]
    if c.eval_split and not c.eval_dataset and c.eval_split == (c.dataset_split or "train"):
        return [f"eval_split={c.eval_split!r} is the split trained on (dataset_split): the held-out accuracy would "
                "be measured on training prompts; name another split (e.g. test), or leave eval_split empty to "
                "hold out rows at random"]
    if not c.answer_column:
        return ["answer_column must name a column"]
    if c.answer_column == c.prompt_column:
        return [f"prompt_column and answer_column are both {c.prompt_column!r}: the prompt and the gold answer "
                "need columns of their own"]
    return []


def _agent_problems(c: TrainConfig) -> list[str]:
    from grouprl.algos.group_advantages import ADVANTAGES, STEP

    if c.agent:
        if not is_import_path(c.agent) or not c.agent.rpartition(":")[2].isidentifier():
            return [f"agent={c.agent!r}: an import path is module:function or path/to/file.py:function"]
        import importlib.util

        if importlib.util.find_spec("openai") is None:
            return [f"agent={c.agent!r} is given an OpenAI client, and openai is not installed: "
                    "pip install 'grouprl[agent]'"]
        if c.env or c.tools:
            return ["agent runs its own loop and tools through the chat endpoint: remove env and tools"]
        if c.dynamic_sampling:
            return ["dynamic_sampling is not available with an agent: train on its trajectories as they come"]
    if not c.env:
        per_step = c.advantage in ADVANTAGES and ADVANTAGES.get(c.advantage).level == STEP
        needs = {"env_options": c.env_options, "tools": c.tools, f"advantage={c.advantage}": per_step}
        stray = [k for k, v in needs.items() if v]
        return [f"{', '.join(stray)} apply to an environment's trajectories, but env is not set"] if stray else []
    problem = _env_problem(c.env)
    if problem:
        return [problem]
    if c.dynamic_sampling:
        return ["dynamic_sampling is not available with an environment: train on its trajectories as they come"]
    if c.task_options:
        return ["task_options apply to a built-in task, but env is set: remove task_options"]
    return []


def _env_problem(spec: str) -> str | None:
    from grouprl.envs.factory import ENVIRONMENTS, HUBS, hub_problem

    if spec.partition(":")[0] in HUBS:
        return hub_problem(spec)
    if is_import_path(spec):
        module, _, attr = spec.rpartition(":")
        return None if module and attr.isidentifier() else \
            f"env={spec!r}: an import path is module:Class or path/to/file.py:Class"
    ENVIRONMENTS.get(spec)  # unknown names fail here with the closest valid ones
    return None


def _size_problems(c: TrainConfig) -> list[str]:
    out = []
    if c.train_size is not None and c.train_size < 1:
        out.append(f"train_size={c.train_size}: set a positive number of prompts or leave it empty")
    if c.eval_size is not None and c.eval_size < 0:
        out.append(f"eval_size={c.eval_size} must be >= 0 (0 = no evaluation)")
    if not 0 <= c.eval_fraction < 1:
        out.append(f"eval_fraction={c.eval_fraction} must be in [0, 1)")
    if not c.prompt_column:
        out.append("prompt_column must name a column")
    return out


def _judge_problems(c: TrainConfig) -> list[str]:
    from pathlib import Path

    from grouprl.rewards.judges import JUDGES
    from grouprl.rewards.remote import is_url

    if c.judge is None:
        return (["judge_weight and judge_options need a judge"] if c.judge_weight is not None or c.judge_options
                else [])
    out = []
    kind, _, argument = c.judge.partition(":")
    if is_url(c.judge):
        pass  # checked with the other services, by remote_problems
    elif kind == "reward_model" and not (Path(argument).expanduser() / "config.json").is_file():
        out.append(f"judge={c.judge!r}: {argument!r} is not a folder saved by grouprl train-rm (no config.json)")
    elif kind not in JUDGES and not is_import_path(c.judge):
        out.append(f"judge={c.judge!r}: give reward_model:<folder>, lm:<model> or an import path module:function")
    elif kind in JUDGES and not argument:
        out.append(f"judge={c.judge!r}: name the {'folder' if kind == 'reward_model' else 'model'} after '{kind}:'")
    if c.judge_weight is not None and not (math.isfinite(c.judge_weight) and c.judge_weight > 0):
        out.append(f"judge_weight={c.judge_weight} must be a positive number (empty: the judge alone)")
    return out


def _reward_problems(c: TrainConfig) -> list[str]:
    from grouprl.rewards import REWARDS
    from grouprl.rewards.remote import is_url, remote_problems

    out = []
    for name in c.reward_functions:
        if is_url(name):
            continue  # checked by remote_problems
        if is_import_path(name):
            module, _, attr = name.rpartition(":")
            if not module or not attr.isidentifier():
                out.append(f"reward function {name!r}: an import path is module:function or path/to/file.py:function")
        else:
            REWARDS.get(name)  # unknown names fail here with the closest valid ones
            try:
                c.builtin_reward(name)
            except (TypeError, ValueError) as e:
                out.append(f"{e} (set its options with reward_options: {{{name}: {{...}}}})")
    stray = sorted(set(c.reward_options) - set(c.reward_functions))
    if stray:
        out.append(f"reward_options for {', '.join(stray)}, which reward_functions does not list "
                   f"({', '.join(c.reward_functions) or 'empty: the task supplies its own'})")
    out += _judge_problems(c) + remote_problems(c)
    if c.accuracy_fn and not is_import_path(c.accuracy_fn):
        out.append(f"accuracy_fn={c.accuracy_fn!r}: give an import path, module:function or file.py:function")
    if out:
        return out
    count = c.reward_count()
    if count == 0 and not c.env and not c.judge and not c.agent and not c.distill_coef:
        out.append("a dataset needs reward_functions (e.g. exact_match, which reads an 'answer' column), a "
                   "reward_model, or a teacher to distil (teacher_model, distill_coef)")
    elif c.reward_weights and len(c.reward_weights) != count:
        out.append(f"reward_weights has {len(c.reward_weights)} values for {count} reward functions "
                   "(reward_functions, or the task's own, then reward_model)")
    return out
