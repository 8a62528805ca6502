"""Held-out evaluation: accuracy by the task's checker, mean reward, pass@k, completion length."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from grouprl.rewards import score_rewards
from grouprl.run.seed_streams import EVAL_STREAM, group_seeds, mix_seed
from grouprl.types import SamplingParams

EVAL_BATCH = 8  # held-out prompts (or resets) sampled together, each k times


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021):
    ``1 - C(n-c, k) / C(n, k)``.

    >>> pass_at_k(4, 1, 1), pass_at_k(4, 1, 4), pass_at_k(4, 0, 2)
    (0.25, 1.0, 0.0)
    """
    if num_samples - num_correct < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(num_samples - num_correct + 1, num_samples + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def evaluate(sampler: Any, prompt_ids: Sequence[list[int]], rows: Sequence[dict[str, Any]], *,
             params: SamplingParams, k: int, reward_fns: Sequence[Callable], reward_weights: Sequence[float],
             is_correct: Callable[[str, dict], bool] | None, seed: int, first: int = 0,
             batch_prompts: int = EVAL_BATCH) -> dict[str, float]:
    """``eval/accuracy``, ``eval/pass@k``, ``eval/mean_reward``, ``eval/len_mean`` of ``k`` completions per prompt
    (one if greedy). Sample j of held-out prompt i (``first`` is the place of ``rows[0]``) draws from
    ``(seed, EVAL_STREAM, i, j)`` alone, so any split over processes evaluates the same."""
    k = 1 if params.temperature == 0 else k
    correct, rewards, lengths, passes = [], [], [], []
    for start in range(0, len(rows), batch_prompts):
        chunk_rows = rows[start:start + batch_prompts]
        columns = {key: [r.get(key) for r in chunk_rows] for key in chunk_rows[0] if key != "prompt"}
        seeds = group_seeds(mix_seed(seed, EVAL_STREAM), first + start, len(chunk_rows), k)
        batch = sampler.generate(list(prompt_ids[start:start + batch_prompts]), k, params, seed=seeds,
                                 prompts=[r["prompt"] for r in chunk_rows], extras=columns)
        lengths.extend(batch.lengths.tolist())
        if reward_fns:
            ids = [row[: int(n)].tolist() for row, n in zip(batch.completion_ids, batch.lengths)]
            scores = score_rewards(reward_fns, reward_weights, batch.prompts, batch.completions, ids, batch.extras)
            rewards.extend(scores.total.tolist())
        if is_correct is not None:
            ok = [bool(is_correct(text, chunk_rows[i // k])) for i, text in enumerate(batch.completions)]
            correct.extend(ok)
            passes.extend(pass_at_k(k, sum(ok[p * k:(p + 1) * k]), k) for p in range(len(chunk_rows)))
    out = {"eval/len_mean": float(torch.tensor(lengths, dtype=torch.float32).mean())}
    if rewards:
        out["eval/mean_reward"] = float(torch.tensor(rewards).nanmean())
    if correct:
        out["eval/accuracy"] = sum(correct) / len(correct)
        out[f"eval/pass@{k}"] = sum(passes) / len(passes)
    return out
