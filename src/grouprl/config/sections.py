"""Where each key of ``grouprl train`` stands in ``--help`` and the docs: in the ``SECTION`` of the class that
defines it, sections in :data:`ORDER`, keys in the config's order; a key without one last, under :data:`OTHER`."""

from __future__ import annotations

import dataclasses

from grouprl.config.train_config import DataKeys, EnvKeys, RewardKeys, TrainConfig
from grouprl.trainer.config import (
    AlgorithmKeys,
    CriticKeys,
    DistributionKeys,
    EngineKeys,
    EvaluationKeys,
    LoRAKeys,
    OptimizerKeys,
    PolicyLossKeys,
    RunFolderKeys,
    SamplingKeys,
    TrustRegionKeys,
)

MODEL_AND_DATA = DataKeys.SECTION
REWARDS = RewardKeys.SECTION
SAMPLING = SamplingKeys.SECTION
ALGORITHM = AlgorithmKeys.SECTION
POLICY_LOSSES = PolicyLossKeys.SECTION
OPTIMIZER = OptimizerKeys.SECTION
PPO = CriticKeys.SECTION
TRPO = TrustRegionKeys.SECTION
AGENTS = EnvKeys.SECTION
LORA = LoRAKeys.SECTION
PRECISION = EngineKeys.SECTION
DISTRIBUTION = DistributionKeys.SECTION
EVALUATION = EvaluationKeys.SECTION
RUN_FOLDER = RunFolderKeys.SECTION
OTHER = "other options"

ORDER = (MODEL_AND_DATA, REWARDS, SAMPLING, ALGORITHM, POLICY_LOSSES, OPTIMIZER, PPO, TRPO, AGENTS, LORA, PRECISION,
         DISTRIBUTION, EVALUATION, RUN_FOLDER)
"""The sections in ``--help`` order: what to train on first, how the run computes last."""

SECTION_NOTES: dict[str, str] = {
    POLICY_LOSSES: "Each read only with the policy_loss its name starts with.",
    PPO: "Read only with --algo ppo; refused under another algorithm.",
    TRPO: "Read only with --algo trpo; refused under another algorithm.",
    AGENTS: "With env set, max_new_tokens is per turn.",
    DISTRIBUTION: "train --nproc N or torchrun; unused in one process on a CPU.",
}

USUAL_KEYS: tuple[str, ...] = ("model", "task", "dataset", "reward_functions", "total_steps", "prompts_per_step",
                               "group_size", "max_new_tokens", "lr", "output_dir", "loggers", "resume_from")
"""The keys of a usual run, which the first screen of ``grouprl train --help`` shows one line each."""


def key_sections(cls: type) -> dict[str, str]:
    """Field name -> its section (the ``SECTION`` of the class that defines it), sections in :data:`ORDER`."""
    section_of = {}
    for klass in cls.__mro__:
        for name in klass.__dict__.get("__annotations__", {}):
            section_of.setdefault(name, klass.__dict__.get("SECTION", OTHER))
    rank = {title: i for i, title in enumerate((*ORDER, OTHER))}
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    return {n: section_of[n] for n in sorted(names, key=lambda n: rank.get(section_of[n], len(ORDER)))}


SECTIONS: dict[str, str] = key_sections(TrainConfig)
"""``grouprl train``'s keys -> their ``--help`` section, in help order."""


def short_name(title: str) -> str:
    """A section's name on the command line (``grouprl train --help sampling``): its title's first word.

    >>> short_name(RUN_FOLDER)
    'run'
    """
    return title.split()[0].lower()


def section_order(names: list[str], sections: dict[str, str] = SECTIONS) -> list[tuple[str, list[str]]]:
    """``names`` grouped into [(section, fields)] in the order of ``sections`` (like :data:`SECTIONS`); the rest
    last, under :data:`OTHER`.

    >>> section_order(["lr", "new_key", "model", "task"])
    [('model and data', ['model', 'task']), ('optimizer', ['lr']), ('other options', ['new_key'])]
    """
    given = set(names)
    grouped: dict[str, list[str]] = {}
    for name, section in sections.items():
        if name in given:
            grouped.setdefault(section, []).append(name)
    rest = [n for n in names if n not in sections]
    if rest:
        grouped.setdefault(OTHER, []).extend(rest)
    return list(grouped.items())
