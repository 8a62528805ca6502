"""The config's side of the loss variants: the keys each policy loss and rollout correction reads, the numbers
their functions get, and the checks that refuse a variant's key under another."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from grouprl.algos import POLICY_LOSSES
from grouprl.algos.rollout_correction import ROLLOUT_IS_LEVELS, rollout_is_weights
from grouprl.trainer.algorithms import ALGORITHMS

if TYPE_CHECKING:
    from grouprl.trainer.config import TrainerConfig

POLICY_LOSS_KEYS: dict[str, dict[str, str]] = {
    "clip": {"eps_low": "eps_low", "eps_high": "eps_high", "dual_clip": "dual_clip", "importance_level": "level"},
    "cispo": {"cispo_eps_low": "eps_low", "cispo_eps_high": "eps_high"},
    "sapo": {"sapo_tau_pos": "tau_pos", "sapo_tau_neg": "tau_neg"},
    "gmpo": {"gmpo_eps_low": "eps_low", "gmpo_eps_high": "eps_high"},
}
"""policy_loss name -> {config key: keyword of its function in :data:`grouprl.algos.POLICY_LOSSES`}."""

ROLLOUT_IS_KEYS: dict[str, dict[str, str]] = {
    "token": {"rollout_is_cap": "cap"},
    "sequence": {"rollout_is_cap": "cap"},
    "icepop": {"icepop_low": "low", "icepop_high": "high"},
    "sequence-mask": {"sequence_mask_low": "low", "sequence_mask_high": "high"},
}
"""rollout_is level -> {config key: keyword of its function in ``ROLLOUT_IS_LEVELS``}; ``auto`` reads token's keys."""


def policy_options(c: TrainerConfig) -> dict[str, Any]:
    """The keyword numbers of ``c.policy_loss``'s function, from config ``c``."""
    return {arg: getattr(c, key) for key, arg in POLICY_LOSS_KEYS[c.policy_loss].items()}


def rollout_correction(c: TrainerConfig, train_logp: torch.Tensor, rollout_logp: torch.Tensor,
                       mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(weights [B,T], metrics)`` of the rollout correction ``c.rollout_is`` resolves to (not none)."""
    level = c.rollout_is_level
    knobs = {arg: getattr(c, key) for key, arg in ROLLOUT_IS_KEYS[level].items()}
    return rollout_is_weights(train_logp, rollout_logp, mask, level=level, **knobs)


def _readers(table: dict[str, dict[str, str]], key: str) -> list[str]:
    return [name for name, keys in table.items() if key in keys]


def _stray_keys(c: TrainerConfig, field: str, chosen: str, reads: set[str],
                table: dict[str, dict[str, str]]) -> list[str]:
    """Keys of ``table`` that ``chosen`` does not read, set away from their defaults."""
    defaults = {f.name: f.default for f in dataclasses.fields(c) if f.default is not dataclasses.MISSING}
    out = []
    for key in sorted({k for keys in table.values() for k in keys} - reads):
        if getattr(c, key) != defaults.get(key):
            readers = _readers(table, key)
            out.append(f"{key}={getattr(c, key)!r} is a setting of {field} {' or '.join(readers)}; {field}={chosen} "
                       f"does not read it: remove it or set --{field} {readers[0]}")
    return out


def variant_problems(c: TrainerConfig) -> list[str]:
    """Problems of config ``c``'s loss variants: names, ranges, another variant's keys, an unapplied variant."""
    if c.policy_loss not in POLICY_LOSS_KEYS:
        return [f"policy_loss={c.policy_loss!r} is not one of: {', '.join(POLICY_LOSSES.names())}"]
    out = _stray_keys(c, "policy_loss", c.policy_loss, set(POLICY_LOSS_KEYS[c.policy_loss]), POLICY_LOSS_KEYS)
    if c.rollout_is in ROLLOUT_IS_LEVELS or c.rollout_is in ("auto", "none"):
        reads = set(ROLLOUT_IS_KEYS.get("token" if c.rollout_is == "auto" else c.rollout_is, {}))
        out += _stray_keys(c, "rollout_is", c.rollout_is, reads, ROLLOUT_IS_KEYS)
    out += _range_problems(c)
    if ALGORITHMS.get(c.algo).update != "clipped":
        for key, plain in (("policy_loss", "clip"), ("top_entropy_quantile", 1.0)):
            if getattr(c, key) != plain:
                out.append(f"{key}={getattr(c, key)!r} applies to the clipped-surrogate update; algo={c.algo} takes "
                           "a natural-gradient step on its own surrogate: remove it")
    return out


def _range_problems(c: TrainerConfig) -> list[str]:
    """Bounds that tie two keys (single keys' ranges are :data:`grouprl.trainer.checks.BOUNDS`)."""
    out = []
    for low, high in (("icepop_low", "icepop_high"), ("sequence_mask_low", "sequence_mask_high")):
        if not 0 <= getattr(c, low) <= 1 <= getattr(c, high):
            out.append(f"{low}={getattr(c, low)} and {high}={getattr(c, high)} must satisfy 0 <= {low} <= 1 <= "
                       f"{high}: a band without 1 drops the tokens where the engines agree")
    return out
