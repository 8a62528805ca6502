"""The trainer's configuration: every knob of every language-model algorithm, documented once. Importing it
imports neither torch nor the trainer; :func:`grouprl.config.check` checks a config (the CLI on reading it, the
Trainer on taking it).

:class:`TrainerConfig` is one flat dataclass (``config.max_staleness``, ``dataclasses.replace``, one
mapping in config.yaml) assembled from the groups of keys defined beside it, each documented where it is
defined: :mod:`~grouprl.trainer.config.algorithm` (algorithm, batch shape, optimizer),
:mod:`~grouprl.trainer.config.objective` (KL, policy loss, advantage, aggregation, ppo, trpo),
:mod:`~grouprl.trainer.config.sampling` (sampling and agents), :mod:`~grouprl.trainer.config.engines`
(number formats, memory, LoRA, processes, rollout engines and servers) and
:mod:`~grouprl.trainer.config.run` (run folder, logging, evaluation, checkpoints).

Defaults follow DeepSeekMath's GRPO where the paper fixes a value; where TRL or verl differ the
field says so. Each docstring is also the ``--help`` text and the docs' config reference (docs/configuration.md).
``algo`` picks the algorithm (:data:`grouprl.trainer.algorithms.ALGORITHMS`); a key that only
another algorithm reads is refused when set, naming the algorithm that reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

from grouprl.trainer.config.algorithm import AlgorithmKeys
from grouprl.trainer.config.engines import EngineKeys
from grouprl.trainer.config.objective import ObjectiveKeys
from grouprl.trainer.config.run import RunKeys
from grouprl.trainer.config.sampling import SamplingKeys
from grouprl.trainer.resolved import ResolvedSettings


# A dataclass takes its bases' fields from the last base to the first: listed last-first, the keys run
# algorithm, objective, sampling, engines, run, the order config.yaml records them in.
@dataclass
class TrainerConfig(RunKeys, EngineKeys, SamplingKeys, ObjectiveKeys, AlgorithmKeys, ResolvedSettings):
    """The trainer's configuration: the keys of its bases, flat, with the derived values of
    :class:`~grouprl.trainer.resolved.ResolvedSettings`."""


GRPOConfig = TrainerConfig
"""The trainer's config under the library's first name (``algo`` defaults to grpo)."""

__all__ = ["AlgorithmKeys", "EngineKeys", "GRPOConfig", "ObjectiveKeys", "RunKeys", "SamplingKeys", "TrainerConfig"]
