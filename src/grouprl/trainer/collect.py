"""Collecting a step's experience: P prompts -> G completions each -> rewards, with DAPO's dynamic
sampling. Knows nothing of advantages or losses."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from grouprl.algos import constant_groups
from grouprl.rewards import score_rewards
from grouprl.rewards.remote import mark_unscored
from grouprl.run.logs import PhaseTimer
from grouprl.run.seed_streams import PromptStream, group_seeds, mix_seed
from grouprl.trainer.judging import apply_judge
from grouprl.trainer.sampling import rollout_params
from grouprl.types import RolloutBatch

if TYPE_CHECKING:
    from grouprl.trainer.config import TrainerConfig


@dataclass
class Collected:
    """One step's rollout and its rewards (B = P * G rows, prompt-major)."""

    batch: RolloutBatch
    rewards: torch.Tensor
    """[B] float32: the weighted sum of the reward functions, NaN where none applied."""
    per_fn: dict[str, torch.Tensor]
    """reward function name -> [B] float32, NaN where it returned None."""
    rounds: int
    """Rollout rounds (more than 1 only under dynamic sampling)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The judge's ``judge/*`` metrics, combined over rounds."""

    def to(self, device: torch.device) -> Collected:
        return replace(self, batch=self.batch.to(device), rewards=self.rewards.to(device),
                       per_fn={k: v.to(device) for k, v in self.per_fn.items()})


class GroupCollector:
    """Draws each step's prompts from a seeded stream, samples G completions of each and scores them."""

    def __init__(self, sampler: Any, rows: Sequence[dict[str, Any]], prompt_ids: Sequence[list[int]],
                 reward_fns: Sequence[Callable], reward_weights: Sequence[float], config: TrainerConfig,
                 share: Callable[[int], tuple[int, int]], stop_ids: tuple[int, ...] = (), judge: Any = None,
                 judge_weight: float | None = None):
        self.sampler, self.rows, self.prompt_ids = sampler, list(rows), list(prompt_ids)
        self.reward_fns, self.reward_weights = list(reward_fns), list(reward_weights)
        self.judge, self.judge_weight, self.judge_rounds = judge, judge_weight, []
        self.config, self.share, self.stop_ids = config, share, stop_ids
        self.stream = PromptStream(len(self.rows), config.seed)

    def collect(self, step: int, timer: PhaseTimer) -> Collected:
        """P groups of G completions with their rewards; dynamic sampling drops all-equal groups and samples more."""
        c = self.config
        kept: list[tuple[RolloutBatch, torch.Tensor, dict]] = []
        have, rounds, self.judge_rounds = 0, 0, []
        while rounds < (c.dynamic_sampling_max_rounds if c.dynamic_sampling else 1) and have < c.prompts_per_step:
            batch, total, per_fn = self.sample(step, rounds, timer)
            rounds += 1
            if c.dynamic_sampling:
                ids = batch.group_ids
                constant = constant_groups(total, None if ids is not None else c.group_size, group_ids=ids)
                informative = (~constant).nonzero().squeeze(-1)  # [P'] group indices
                if len(informative) == 0 and (kept or rounds < c.dynamic_sampling_max_rounds):
                    continue
                if len(informative):
                    rows = batch.rows_of_groups(informative[: c.prompts_per_step - have])
                    batch = batch.select_rows(rows)
                    total, per_fn = total[rows], {k: v[rows] for k, v in per_fn.items()}
            kept.append((batch, total, per_fn))
            have += batch.num_groups
        return Collected(batch=RolloutBatch.cat([b for b, _, _ in kept]), rewards=torch.cat([t for _, t, _ in kept]),
                         per_fn={k: torch.cat([f[k] for _, _, f in kept]) for k in kept[0][2]}, rounds=rounds,
                         metrics=combine_metrics(self.judge_rounds, absent_is_zero=False))

    def sample(self, step: int, round_: int, timer: PhaseTimer) -> tuple[RolloutBatch, torch.Tensor, dict]:
        """One round: this process's share of the next P prompts, G completions each, scored."""
        c = self.config
        idx = self.stream.take(c.prompts_per_step)  # every process advances the stream by the whole batch
        first, stop = self.share(len(idx))
        rows = [self.rows[i] for i in idx[first:stop]]
        columns = {k: [r.get(k) for r in rows] for k in rows[0] if k != "prompt"}
        with timer("rollout"):
            batch = self.sampler.generate([self.prompt_ids[i] for i in idx[first:stop]], c.group_size,
                                          rollout_params(c, self.stop_ids),
                                          seed=group_seeds(mix_seed(c.seed, step, round_), first, stop - first,
                                                           c.group_size),
                                          prompts=[r["prompt"] for r in rows], extras=columns)
        if c.group_by is not None:  # rows that share the column's value are compared with each other
            batch.group_ids = factorize(batch.extras[c.group_by])
        with timer("reward"):
            ids = [row[: int(n)].tolist() for row, n in zip(batch.completion_ids, batch.lengths)]
            total, per_fn = None, {}
            if self.reward_fns:
                scores = score_rewards(self.reward_fns, self.reward_weights, batch.prompts, batch.completions, ids,
                                       batch.extras)
                total, per_fn = scores.total, scores.per_fn
            elif self.judge is None:  # distilled without a task reward: the teacher's signal is the only one
                total = torch.zeros(batch.batch_size)
        if self.judge is not None:
            with timer("judge"):
                total, per_fn, metrics = apply_judge(self.judge, self.judge_weight, batch, total, per_fn, batch.extras)
            self.judge_rounds.append(metrics)
        total, failed = mark_unscored(self.reward_fns, self.judge, self.judge_weight, total, batch.completions,
                                      batch.group_index())
        if failed:
            self.judge_rounds.append(failed)
        return batch, total, per_fn


def combine_metrics(parts: Sequence[dict[str, float]], *, absent_is_zero: bool) -> dict[str, float]:
    """Collection metrics combined over parts: dropped groups add up, the rest are averaged over the parts
    that report them or, with ``absent_is_zero`` (processes with equal shares), over all parts.

    >>> parts = [{"env/ended_env": 1.0, "judge/dropped_groups": 1.0},
    ...          {"env/ended_env": 0.5, "env/ended_error": 0.5, "judge/dropped_groups": 2.0}]
    >>> combine_metrics(parts, absent_is_zero=True)
    {'env/ended_env': 0.75, 'env/ended_error': 0.25, 'judge/dropped_groups': 3.0}
    >>> combine_metrics(parts, absent_is_zero=False)["env/ended_error"]
    0.5
    """
    keys = sorted({k for p in parts for k in p})

    def count(k: str) -> int:
        if k in ("judge/dropped_groups", "reward/remote_failed"):
            return 1
        return len(parts) if absent_is_zero else sum(k in p for p in parts)

    return {k: sum(p.get(k, 0.0) for p in parts) / count(k) for k in keys}


def factorize(values: Sequence[Any]) -> torch.Tensor:
    """``[B]`` long ids, equal for equal values, numbered in order of first appearance.

    >>> factorize(["b", "a", "b", 3]).tolist()
    [0, 1, 0, 2]
    """
    seen: dict[str, int] = {}
    return torch.tensor([seen.setdefault(repr(v), len(seen)) for v in values], dtype=torch.long)
