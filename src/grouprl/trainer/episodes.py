"""A step's experience from environments: P resets -> G trajectories each -> returns plus reward functions over
the final answers. A trajectory whose environment failed or whose template rewrote history is dropped."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from grouprl.envs import transcript
from grouprl.rewards import score_rewards
from grouprl.rewards.base import combine, unique_names
from grouprl.rewards.remote import mark_unscored
from grouprl.run.logs import PhaseTimer
from grouprl.run.seed_streams import EVAL_STREAM, PromptStream, group_seeds, mix_seed
from grouprl.trainer.collect import Collected
from grouprl.trainer.config import TrainerConfig
from grouprl.trainer.evaluate import EVAL_BATCH
from grouprl.trainer.judging import apply_judge
from grouprl.trainer.sampling import rollout_params
from grouprl.types import RolloutBatch

DROPPED = ("error", "template")  # end reasons that carry no usable signal


class EnvCollector:
    """Draws each step's resets from a seeded stream and plays G trajectories from each."""

    def __init__(self, sampler: Any, rows: Sequence[dict[str, Any]], env: Callable[[], Any], tools: Sequence[Any],
                 reward_fns: Sequence[Callable], reward_weights: Sequence[float], config: TrainerConfig,
                 share: Callable[[int], tuple[int, int]], judge: Any = None, judge_weight: float | None = None):
        self.sampler, self.rows, self.env, self.tools = sampler, list(rows), env, list(tools)
        self.reward_fns, self.reward_weights = list(reward_fns), list(reward_weights)
        self.judge, self.judge_weight = judge, judge_weight
        self.config, self.share = config, share
        self.stream = PromptStream(len(self.rows), config.seed)
        from grouprl.envs.tools import resolve_tool_parser

        self.parse = resolve_tool_parser(config.tool_parser)  # once: an import path is not imported per episode

    def episodes(self, rows: Sequence[dict[str, Any]], indices: Sequence[int], group_size: int) -> list[Any]:
        """``group_size`` fresh episodes per row, group-major, seeded by its ``seed`` column, else its index."""
        from grouprl.envs.episode import Episode

        c = self.config
        return [Episode(self.env(), self.tools, seed=int(row.get("seed", i)), options=dict(row),
                        max_tool_calls=c.max_tool_calls, tool_parser=self.parse, tool_timeout_s=c.tool_timeout_s)
                for row, i in zip(rows, indices) for _ in range(group_size)]

    def collect(self, step: int, timer: PhaseTimer) -> Collected:
        c = self.config
        idx = self.stream.take(c.prompts_per_step)  # every process advances the stream by the whole batch
        first, stop = self.share(len(idx))
        rows = [self.rows[i] for i in idx[first:stop]]
        with timer("rollout"):
            batch = self.sampler.generate(self.episodes(rows, idx[first:stop], c.group_size), c.group_size,
                                          rollout_params(c),
                                          seed=group_seeds(mix_seed(c.seed, step), first, len(rows), c.group_size))
        # why the trajectories ended, over every one played: the dropped ones leave the batch the rest is measured on
        ended = batch.info["end_reason"]
        metrics = {f"env/ended_{reason}": ended.count(reason) / len(ended) for reason in sorted(set(ended))}
        with timer("reward"):
            batch, total, per_fn = self.score(batch, rows)
        if self.judge is not None:
            with timer("judge"):
                reset = batch.group_ids if batch.group_ids is not None else (
                    torch.arange(batch.batch_size) // batch.group_size)  # each row's index into rows
                columns = {k: [rows[int(r)].get(k) for r in reset] for k in (rows[0] if rows else {})}
                # the judge reads whole trajectories (every turn, the environment's replies too), not last answers
                shown = [transcript(m[o:]) for m, o in zip(batch.extras["trajectory"], batch.info["opening"])]
                total, per_fn, judged = apply_judge(self.judge, self.judge_weight, batch, total, per_fn, columns, shown)
                metrics.update(judged)
        total, failed = mark_unscored(self.reward_fns, self.judge, self.judge_weight, total, batch.completions,
                                      batch.group_index())
        metrics.update(failed)
        return Collected(batch=batch, rewards=total, per_fn=per_fn, rounds=1, metrics=metrics)

    def score(self, batch: RolloutBatch, rows: Sequence[dict[str, Any]]) -> tuple[RolloutBatch, torch.Tensor, dict]:
        """Drop failed trajectories; each one's reward is its return plus the weighted reward functions."""
        g = batch.group_size
        keep = [i for i, reason in enumerate(batch.info["end_reason"]) if reason not in DROPPED]
        if len(keep) < batch.batch_size:
            batch = batch.select_rows(keep)
            batch.group_ids = torch.tensor(keep) // g  # the reset each row came from
        returns = torch.tensor([float(r) for r in batch.info["return_"]], dtype=torch.float32)
        per_fn = {"env": returns}
        weights = {"env": 1.0}
        if self.reward_fns:
            columns = {k: [rows[i // g].get(k) for i in keep] for k in rows[0]} if rows else {}
            ids = [row[batch.completion_mask[i] > 0].tolist() for i, row in enumerate(batch.completion_ids)]
            scores = score_rewards(self.reward_fns, self.reward_weights, batch.prompts, batch.completions, ids,
                                   {**columns, "trajectory": batch.extras["trajectory"]})
            per_fn.update(scores.per_fn)
            weights.update(dict(zip(unique_names(self.reward_fns), self.reward_weights)))
        return batch, combine(per_fn, weights), per_fn


def evaluate_episodes(collector: EnvCollector, rows: Sequence[dict[str, Any]], *, params: Any, k: int, seed: int,
                      first: int = 0, batch_resets: int = EVAL_BATCH) -> dict[str, float]:
    """``eval/success``, ``eval/pass@k``, ``eval/mean_reward``, ``eval/turns_mean``, ``eval/len_mean`` of ``k``
    trajectories from each held-out reset; trajectory j of reset i draws from ``(seed, EVAL_STREAM, i, j)`` alone."""
    k = 1 if params.temperature == 0 else k
    returns, turns, lengths, success, passes = [], [], [], [], []
    for start in range(0, len(rows), batch_resets):
        chunk = list(rows[start:start + batch_resets])
        indices = range(first + start, first + start + len(chunk))
        batch = collector.sampler.generate(collector.episodes(chunk, indices, k), k, params,
                                           seed=group_seeds(mix_seed(seed, EVAL_STREAM), first + start, len(chunk), k))
        returns += [float(r) for r in batch.info["return_"]]
        turns += batch.info["turns"]
        lengths += batch.lengths.tolist()
        flags = [bool(s) for s in batch.info["success"] if s is not None]
        success += flags
        if len(flags) == batch.batch_size:
            passes += [any(flags[p * k:(p + 1) * k]) for p in range(len(chunk))]
    out = {"eval/mean_reward": sum(returns) / len(returns), "eval/turns_mean": sum(turns) / len(turns),
           "eval/len_mean": sum(lengths) / len(lengths)}
    if success:
        out["eval/success"] = sum(success) / len(success)
    if passes:
        out[f"eval/pass@{k}"] = sum(passes) / len(passes)
    return out
