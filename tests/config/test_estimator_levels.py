"""Advantage estimators declare their level (per completion or per step) and the scales they take in their
registry entry; the config checks and the trainer's choice of baseline read the entry, never a name."""

from __future__ import annotations

import pytest

from grouprl.algos.group_advantages import ADVANTAGES, COMPLETION, STEP, Estimator, completion_estimators
from grouprl.config import TrainConfig, check
from grouprl.trainer.advantages import GroupBaseline, make_baseline
from grouprl.trainer.config import TrainerConfig
from grouprl.trainer.steps import StepGroupBaseline


def test_every_estimator_declares_its_level():
    levels = {name: ADVANTAGES.get(name).level for name in ADVANTAGES}
    assert levels == {"gigpo": STEP, "grpo": COMPLETION, "rank": COMPLETION, "reinforce": COMPLETION,
                      "rloo": COMPLETION}
    assert completion_estimators() == ["grpo", "rank", "reinforce", "rloo"]


@pytest.mark.parametrize(("advantage", "baseline"), [("gigpo", StepGroupBaseline), ("rloo", GroupBaseline),
                                                      ("rank", GroupBaseline)])
def test_the_baseline_follows_the_declared_level(advantage, baseline):
    assert type(make_baseline(TrainerConfig(advantage=advantage), None)) is baseline


def test_a_new_per_step_estimator_is_treated_as_one_by_its_entry_alone(monkeypatch):
    monkeypatch.setitem(ADVANTAGES._entries, "turnwise", Estimator(STEP, scales=("none",)))
    config = TrainerConfig(advantage="turnwise", advantage_scale="none")
    assert type(make_baseline(config, None)) is StepGroupBaseline
    with pytest.raises(ValueError, match=r"advantage_scale='group': advantage=turnwise takes none$"):
        check(TrainerConfig(advantage="turnwise", advantage_scale="group"))
    with pytest.raises(ValueError, match="advantage=turnwise apply to an environment's trajectories"):
        check(TrainConfig(advantage="turnwise", advantage_scale="none"))


def test_gigpo_scales_come_from_its_entry():
    assert ADVANTAGES.get("gigpo").scales == ("group", "none")
    check(TrainerConfig(advantage="gigpo", advantage_scale="none"))  # accepted
    with pytest.raises(ValueError, match=r"advantage_scale='batch': advantage=gigpo takes group or none"):
        check(TrainerConfig(advantage="gigpo", advantage_scale="batch"))
    with pytest.raises(ValueError, match="not one of: gigpo, grpo, rank, reinforce, rloo"):
        check(TrainerConfig(advantage="gipgo"))


def test_classic_control_reads_the_same_entries():
    from grouprl.control.config import ControlConfig, GRPOControlConfig

    ControlConfig(grpo=GRPOControlConfig(advantage="gigpo", advantage_scale="none"))
    with pytest.raises(ValueError, match=r"grpo.advantage_scale='batch': advantage=gigpo takes group or none"):
        ControlConfig(grpo=GRPOControlConfig(advantage="gigpo", advantage_scale="batch"))
