"""A step's metrics (in docs/design.md's namespaces) and sample records, from tensors to plain numbers."""

from __future__ import annotations

from typing import Any

import torch

from grouprl.types import RolloutBatch


class MetricAverager:
    """Averages per-micro-batch metrics: ``loss/*`` (globally normalised pieces of one minibatch loss) are summed
    within an optimizer step, ``loss/*`` and ``optim/*`` averaged over steps, the rest token-weighted."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.optimizer_steps = 0

    def add(self, metrics: dict[str, torch.Tensor | float], tokens: float) -> None:
        for k, v in metrics.items():
            v = float(v)
            if k.startswith(("loss/", "optim/")):
                self.sums[k] = self.sums.get(k, 0.0) + v
                self.weights[k] = 1.0
            else:
                self.sums[k] = self.sums.get(k, 0.0) + v * tokens
                self.weights[k] = self.weights.get(k, 0.0) + tokens

    def result(self) -> dict[str, float]:
        steps = max(1, self.optimizer_steps)
        return {k: (v / steps if k.startswith(("loss/", "optim/")) else v / max(self.weights[k], 1e-12))
                for k, v in self.sums.items()}


def reward_metrics(rewards: torch.Tensor, per_fn: dict[str, torch.Tensor],
                   constant: torch.Tensor | None) -> dict[str, float]:
    """``reward/mean|std``, ``reward/<name>`` and, with ``constant [B]``, ``rollout/zero_std_frac``."""
    valid = rewards[~torch.isnan(rewards)]
    out = {"reward/mean": float(valid.mean()) if len(valid) else float("nan"),
           "reward/std": float(valid.std(unbiased=False)) if len(valid) else float("nan")}
    if constant is not None:
        out["rollout/zero_std_frac"] = float(constant.float().mean())
    for name, values in per_fn.items():
        out[f"reward/{name}"] = float(values.nanmean())
    return out


def rollout_metrics(batch: RolloutBatch, rounds: int) -> dict[str, float]:
    """``rollout/*``, and ``env/*`` of trajectories (``env/ended_<reason>`` is the collector's, dropped ones too)."""
    lengths = batch.lengths.float()
    out = {"rollout/len_mean": float(lengths.mean()), "rollout/len_max": float(lengths.max()),
           "rollout/truncated_frac": float(batch.truncated.float().mean()), "rollout/rounds": float(rounds),
           "rollout/groups": float(batch.num_groups)}
    info = batch.info
    if "return_" not in info:
        return out
    mean = lambda values: sum(float(v) for v in values) / max(len(values), 1)  # noqa: E731
    out.update({"env/return_mean": mean(info["return_"]), "env/turns_mean": mean(info["turns"]),
                "env/tool_calls_mean": mean(info["tool_calls"]), "env/tool_errors": mean(info["tool_errors"]),
                "env/truncated_frac": float(batch.truncated.float().mean())})
    said = [s for s in info["success"] if s is not None]
    if said:
        out["env/success"] = mean(said)
    return out


def row_advantages(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` advantages as logged: as given, or per-token ones ``[B, T]`` averaged over each row's counted tokens."""
    if advantages.dim() == 1:
        return advantages
    return (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def sample_records(batch: RolloutBatch, rewards: torch.Tensor, per_fn: dict[str, torch.Tensor],
                   advantages: torch.Tensor) -> list[dict[str, Any]]:
    """One JSON-able record per completion for ``completions.jsonl`` (``advantages [B]``)."""
    def num(x: torch.Tensor) -> float | None:
        return None if torch.isnan(x) else float(x)

    records = [{"prompt": batch.prompts[i] if isinstance(batch.prompts[i], str) else str(batch.prompts[i]),
                "completion": batch.completions[i], "reward": num(rewards[i]),
                "rewards": {k: num(v[i]) for k, v in per_fn.items()}, "advantage": float(advantages[i])}
               for i in range(batch.batch_size)]
    if "trajectory" in batch.extras:  # an agent's records carry the whole conversation with its roles
        for i, r in enumerate(records):
            r.update(trajectory=batch.extras["trajectory"][i], turns=batch.info["turns"][i],
                     success=batch.info["success"][i], end_reason=batch.info["end_reason"][i],
                     opening=batch.info["opening"][i])
            if "step_groups" in batch.info:  # GiGPO: each turn's state, anchor group and advantage
                r.update(state_keys=[str(k) for k in batch.info["state_keys"][i]],
                         step_groups=batch.info["step_groups"][i], turn_advantages=batch.info["turn_advantages"][i])
    return records
