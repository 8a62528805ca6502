"""The trainer's configuration, each key documented once where it is defined (its ``--help`` text and its line in
docs/configuration.md). :class:`TrainerConfig` is one flat dataclass made of parts, one per ``--help`` section;
defaults follow DeepSeekMath's GRPO. Importing it imports neither torch nor the trainer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grouprl.errors import ConfigError
from grouprl.trainer.config.algorithm_keys import (
    AlgorithmKeys,
    CriticKeys,
    OptimizerKeys,
    PolicyLossKeys,
    TrustRegionKeys,
)
from grouprl.trainer.config.engine_keys import DistributionKeys, EngineKeys, LoRAKeys
from grouprl.trainer.config.run_folder_keys import EvaluationKeys, RunFolderKeys
from grouprl.trainer.config.sampling_keys import AgentKeys, PromptKeys, SamplingKeys
from grouprl.trainer.resolved import ResolvedSettings

RETIRED: dict[str, str] = {
    "tensorboard": "use loggers: [tensorboard] (a run writes TensorBoard files only when loggers names it; for "
                   "tensorboard: false, remove the key)",
    "rollout_server_restarts": "a failed rollout server is dropped for the rest of the run and never restarted; with "
                               "none left the run stops, and --resume_from latest goes on from its last checkpoint "
                               "on new servers (remove the key)",
}
"""Keys that no longer exist -> what to write instead, the text every way of giving one is refused with."""


# A dataclass takes its bases' fields from the last base to the first: listed last-first, config.yaml records the
# keys in --help's order.
@dataclass
class TrainerConfig(RunFolderKeys, EvaluationKeys, DistributionKeys, EngineKeys, LoRAKeys, AgentKeys, TrustRegionKeys,
                    CriticKeys, OptimizerKeys, PolicyLossKeys, AlgorithmKeys, SamplingKeys, PromptKeys,
                    ResolvedSettings):
    """The keys of its parts, flat, with the derived values of :class:`~grouprl.trainer.resolved.ResolvedSettings`."""

    RETIRED = RETIRED

    def __new__(cls, *args: Any, **kwargs: Any) -> TrainerConfig:
        # the generated __init__ would only say "unexpected keyword argument": say what replaced the key
        for key in kwargs.keys() & cls.RETIRED.keys():
            raise ConfigError(retired_message(key, cls.RETIRED[key]))
        return super().__new__(cls)


def retired_message(key: str, instead: str) -> str:
    return f"{key} is retired: {instead}."


GRPOConfig = TrainerConfig

PARTS = (PromptKeys, SamplingKeys, AlgorithmKeys, PolicyLossKeys, OptimizerKeys, CriticKeys, TrustRegionKeys, AgentKeys,
         LoRAKeys, EngineKeys, DistributionKeys, EvaluationKeys, RunFolderKeys)

__all__ = ["PARTS", "RETIRED", "AgentKeys", "AlgorithmKeys", "CriticKeys", "DistributionKeys", "EngineKeys",
           "EvaluationKeys", "GRPOConfig", "LoRAKeys", "OptimizerKeys", "PolicyLossKeys", "PromptKeys", "RunFolderKeys",
           "SamplingKeys", "TrainerConfig", "TrustRegionKeys", "retired_message"]
