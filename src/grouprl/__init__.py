"""grouprl: GRPO fine-tuning of language models, with PPO, TRPO and REINFORCE/RLOO baselines. The trainers are
imported lazily, so importing the pure math layer, ``grouprl.algos``, does not pull in transformers."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "GRPOConfig": "grouprl.trainer.config",
    "GRPOTrainer": "grouprl.trainer.trainer",
    "Trainer": "grouprl.trainer.trainer",
    "TrainerConfig": "grouprl.trainer.config",
    "RolloutBatch": "grouprl.types",
    "SamplingParams": "grouprl.types",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'grouprl' has no attribute {name!r}")


__all__ = sorted(_LAZY)
