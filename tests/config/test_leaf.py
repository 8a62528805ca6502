"""The config is a leaf: importing its classes imports neither torch, transformers nor the trainer, and a
config is checked by one function, :func:`grouprl.config.check`, which names every key at fault."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from grouprl.config import ConfigError, TrainConfig, check, from_dict
from grouprl.trainer.config import TrainerConfig

HEAVY = ("torch", "transformers", "numpy", "grouprl.trainer.trainer", "grouprl.trainer.checks", "grouprl.algos")


def test_importing_the_config_classes_imports_nothing_heavy():
    code = ("import sys\nfrom grouprl.trainer.config import TrainerConfig\n"
            "from grouprl.config import TrainConfig, check, load_config\n"
            "TrainConfig(lr=-1.0, group_size=1)\n"  # building one checks nothing, so imports nothing either
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_check_names_every_bad_key_at_once():
    config = TrainerConfig(lr=-1.0, group_size=1, top_p=1.5)  # built without a word
    with pytest.raises(ConfigError) as caught:
        check(config)
    message = str(caught.value)
    assert "group_size=1" in message and "lr=-1.0 must be a finite number > 0" in message
    assert "top_p=1.5 must be in (0, 1]" in message
    assert message.count("; ") == 2  # three problems, one sentence each
    check(TrainerConfig())  # the defaults can run


def test_a_run_config_adds_the_runs_own_checks_and_an_unknown_name_is_a_config_error():
    with pytest.raises(ConfigError, match="reward_weights has 2 values for 1 reward functions"):
        check(TrainConfig(reward_functions=("exact_match",), reward_weights=(1.0, 2.0), dataset=None))
    with pytest.raises(ConfigError, match="did you mean 'arithmetic'"):
        check(TrainConfig(task="arithmetc"))
    with pytest.raises(ConfigError, match="group_size=1"):
        from_dict(TrainConfig, {"group_size": 1})  # a config read from a mapping is checked as it is read


@pytest.mark.parametrize(("value", "bound", "kept"), [
    (0.0, ">= 0", True), (-1e-9, ">= 0", False), (0.0, "a finite number > 0", False), (float("nan"), ">= 0", False),
    (float("inf"), "> 0 (1 = off)", False), (1.0, "in (0, 1] (1 = off)", True), (0.0, "in (0, 1]", False),
    (1.0, "in [0, 1)", False), (0.0, "in [0, 1)", True), (1.0, "in [0, 1]", True), (1.5, "> 1 (or empty)", True),
])
def test_a_bound_is_kept_as_its_message_says(value, bound, kept):
    from grouprl.trainer.checks import within

    assert within(value, bound) is kept


def test_every_bound_names_a_key_and_parses():
    from grouprl.trainer.checks import BOUNDS, within

    fields = {f.name for f in dataclasses.fields(TrainerConfig)}
    assert set(BOUNDS) <= fields
    for key, bound in BOUNDS.items():
        default = getattr(TrainerConfig(), key)
        assert default is None or within(default, bound), key  # every default keeps its own bound
