"""What every language-model trainer shares: the run folder, prompt encoding and order, logging
sinks, evaluation and checkpoints; the loop itself is :mod:`grouprl.trainer.loop`'s. A concrete
trainer supplies ``step()``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from grouprl.rewards.base import check_reward_columns, unique_names
from grouprl.rollout.prompts import encode_prompts
from grouprl.rollout.sampler import Sampler
from grouprl.trainer import checkpoint as ckpt
from grouprl.trainer.evaluate import evaluate
from grouprl.trainer.loop import TrainLoop
from grouprl.trainer.loop import as_plain as _as_plain
from grouprl.trainer.metrics import JsonlLog, Progress
from grouprl.trainer.optim import build_optimizer
from grouprl.types import SamplingParams


class PromptStream:
    """An endless, seeded, reshuffled-every-epoch order over ``n`` prompts; its position is all
    the state a resume needs."""

    def __init__(self, n: int, seed: int, position: int = 0):
        if n == 0:
            raise ValueError("the training set is empty")
        self.n, self.seed, self.position = n, seed, position

    def _epoch_order(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def take(self, count: int) -> list[int]:
        out = []
        while len(out) < count:
            epoch, offset = divmod(self.position, self.n)
            order = self._epoch_order(epoch)
            grab = order[offset:offset + count - len(out)]
            out.extend(grab)
            self.position += len(grab)
        return out


def check_rows(rows: Sequence[dict[str, Any]], what: str) -> None:
    if not rows:
        raise ValueError(f"the {what} set is empty")
    for i, row in enumerate(rows):
        if "prompt" not in row:
            raise ValueError(f"{what} row {i} has no 'prompt' column; its columns are: {', '.join(row)}")


def encode_checked(tokenizer: Any, rows: Sequence[dict[str, Any]], what: str, max_len: int, *,
                   system_prompt: str | None, use_chat_template: bool) -> list[list[int]]:
    """Token ids of every prompt, once; a prompt over ``max_len`` tokens is an error naming its row."""
    ids = encode_prompts(tokenizer, [r["prompt"] for r in rows], system_prompt=system_prompt,
                         use_chat_template=use_chat_template)
    for i, row_ids in enumerate(ids):
        if len(row_ids) > max_len:
            raise ValueError(
                f"{what} row {i}: the prompt is {len(row_ids)} tokens after the chat template, over "
                f"max_prompt_len={max_len}; shorten it or raise max_prompt_len. Prompt: {rows[i]['prompt']!r:.200}"
            )
        if not row_ids:
            raise ValueError(f"{what} row {i}: the prompt is empty")
    return ids


class BaseTrainer(TrainLoop):
    """Run folder, data, sinks, evaluation and checkpoints of a language-model trainer; the loop
    around ``step()`` is :class:`~grouprl.trainer.loop.TrainLoop`'s."""

    name = "trainer"

    def __init__(self, config: Any, *, policy: torch.nn.Module, tokenizer: Any, reward_fns: Sequence[Callable],
                 train_data: Sequence[dict[str, Any]], eval_data: Sequence[dict[str, Any]] | None = None,
                 reward_weights: Sequence[float] | None = None, is_correct: Callable[[str, dict], bool] | None = None,
                 sampler: Any = None, system_prompt: str | None = None, run_config: Any = None):
        self.config = c = config
        if c.num_threads:
            torch.set_num_threads(c.num_threads)
        self.policy, self.tokenizer = policy, tokenizer
        self.reward_fns = list(reward_fns)
        if not self.reward_fns:
            raise ValueError("at least one reward function is needed")
        self.reward_weights = list(reward_weights) if reward_weights is not None else [1.0] * len(self.reward_fns)
        if len(self.reward_weights) != len(self.reward_fns):
            raise ValueError(f"{len(self.reward_weights)} reward weights for {len(self.reward_fns)} reward functions")
        self.reward_names = unique_names(self.reward_fns)
        self.is_correct = is_correct
        check_rows(train_data, "train")
        check_reward_columns(self.reward_fns, [k for k in train_data[0] if k != "prompt"])
        self.train_rows, self.eval_rows = list(train_data), list(eval_data or [])
        if eval_data is not None:
            check_rows(self.eval_rows, "eval")
        sp = c.system_prompt if c.system_prompt is not None else system_prompt
        enc = dict(system_prompt=sp, use_chat_template=c.use_chat_template)
        self.train_ids = encode_checked(tokenizer, self.train_rows, "train", c.max_prompt_len, **enc)
        self.eval_ids = (encode_checked(tokenizer, self.eval_rows, "eval", c.max_prompt_len, **enc)
                         if self.eval_rows else [])
        self.sampler = sampler if sampler is not None else Sampler(policy, tokenizer)
        self.stream = PromptStream(len(self.train_rows), c.seed)
        self.step_count = 0
        self.out = Path(c.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.run_config = run_config if run_config is not None else c
        self.optimizer, self.scheduler = self.make_optimizer()
        self.metrics_log = JsonlLog(self.out / "metrics.jsonl")
        self.completions_log = JsonlLog(self.out / "completions.jsonl")
        self.eval_history: list[dict[str, Any]] = []

    # -- hooks for subclasses ---------------------------------------------------------------------
    def optimizer_steps_per_step(self) -> int:
        return 1

    def make_optimizer(self) -> tuple[torch.optim.Optimizer, Any]:
        """AdamW over the policy's trainable parameters, and its schedule (a multi-process trainer
        makes them again once the policy is sharded)."""
        c = self.config
        return build_optimizer(self.policy.parameters(), c.lr, (c.adam_beta1, c.adam_beta2), c.weight_decay,
                               c.warmup_steps, c.total_steps * self.optimizer_steps_per_step(), c.lr_schedule)

    def extra_state(self) -> dict[str, Any]:
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        pass

    def reference_to_save(self) -> torch.nn.Module | None:
        return None

    def extra_files(self) -> dict[str, Callable[[Path], None]]:
        """Files a subclass adds to each checkpoint: name -> writer of that path."""
        return {}

    def load_extra_files(self, folder: Path) -> None:
        """Read back what :meth:`extra_files` wrote into checkpoint ``folder``."""

    # -- shared machinery -------------------------------------------------------------------------
    def eval_params(self) -> SamplingParams:
        c = self.config
        return SamplingParams(max_new_tokens=c.max_new_tokens, temperature=c.eval_temperature,
                              stop_strings=tuple(c.stop_strings), autocast_bf16=c.dtype == "bf16")

    def evaluate(self) -> dict[str, float]:
        """Evaluate the current policy on the eval set (empty dict without one)."""
        if not self.eval_rows:
            return {}
        self.policy.eval()
        with torch.inference_mode():
            return evaluate(self.sampler, self.eval_ids, self.eval_rows, params=self.eval_params(),
                            k=self.config.eval_samples, reward_fns=self.reward_fns,
                            reward_weights=self.reward_weights, is_correct=self.is_correct,
                            seed=self.config.seed + 7_777_777)

    def save(self) -> Path:
        state = {"position": self.stream.position, "config": _as_plain(self.config), **self.extra_state()}
        return ckpt.save_checkpoint(self.out / "checkpoints", self.step_count, policy=self.policy,
                                    optimizer=self.optimizer, scheduler=self.scheduler, state=state,
                                    tokenizer=self.tokenizer, reference=self.reference_to_save(),
                                    keep=self.config.keep_checkpoints, extra_files=self.extra_files())

    def resume(self, spec: str) -> None:
        folder = ckpt.resolve_checkpoint(spec, self.out / "checkpoints")
        state = ckpt.load_checkpoint(folder, policy=self.policy, optimizer=self.optimizer, scheduler=self.scheduler,
                                     reference=self.reference_to_save())
        self.step_count = int(state["step"])
        self.stream.position = int(state["position"])
        self.load_extra_state(state)
        self.load_extra_files(folder)
        self.metrics_log.truncate_after(self.step_count)
        self.completions_log.truncate_after(self.step_count)

    def log_completions(self, records: list[dict[str, Any]], progress: Progress) -> None:
        c = self.config
        if not c.log_completions_every or self.step_count % c.log_completions_every:
            return
        self.completions_log.append([{"step": self.step_count, **r} for r in records])
        for r in records[: c.print_completions]:
            progress.print(f"[dim]step {self.step_count} reward {r['reward']:.3f}[/dim] {r['completion'][:200]!r}")
