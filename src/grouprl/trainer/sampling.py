"""How a run samples: its config's sampling keys as the engines' :class:`~grouprl.types.SamplingParams`."""

from __future__ import annotations

from grouprl.trainer.config import TrainerConfig
from grouprl.types import SamplingParams


def rollout_params(c: TrainerConfig, stop_token_ids: tuple[int, ...] = ()) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=c.max_new_tokens, temperature=c.temperature, top_k=c.top_k, top_p=c.top_p, min_p=c.min_p,
        repetition_penalty=c.repetition_penalty, stop_token_ids=tuple(stop_token_ids),
        stop_strings=tuple(c.stop_strings), mode=c.rollout_mode, format=c.rollout_format,
    )


def eval_params(c: TrainerConfig) -> SamplingParams:
    """The training sampling with ``eval_temperature``."""
    return SamplingParams(max_new_tokens=c.max_new_tokens, temperature=c.eval_temperature,
                          stop_strings=tuple(c.stop_strings), format=c.rollout_format)
