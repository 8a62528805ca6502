"""REINFORCE (group-mean baseline) and RLOO are GRPO's update with another advantage estimator:
``--algo rloo`` is ``--algo grpo --advantage rloo --advantage_scale none``, and they train."""

import pytest
import torch

from grouprl.algos import compute_advantages
from tests.helpers.trainer import make_trainer, rollout


@pytest.mark.parametrize("by", ["algo", "advantage"])
def test_estimators_reach_the_update_through_the_config(tmp_path, by):
    # The same rollout, three estimators: the update sees exactly compute_advantages(name, ...), whether
    # the algorithm is named (--algo rloo) or the estimator (--advantage rloo --advantage_scale none).
    seen = {}
    for name in ("grpo", "reinforce", "rloo"):
        settings = ({"algo": name} if by == "algo" else
                    {"advantage": name, "advantage_scale": "group" if name == "grpo" else "none"})
        trainer = make_trainer(tmp_path / by / name, beta=0.0, **settings)

        def capture(data, step, beta, _name=name):
            seen[_name] = data.advantages
            return {}

        trainer.rule.update = capture
        trainer.step()
    _, rewards = rollout(make_trainer(tmp_path / "again", beta=0.0))
    for name, scale in (("grpo", "group"), ("reinforce", "none"), ("rloo", "none")):
        torch.testing.assert_close(seen[name], compute_advantages(name, rewards, 4, scale))
    # RLOO is REINFORCE scaled by G / (G - 1) within each group
    torch.testing.assert_close(seen["rloo"], seen["reinforce"] * 4 / 3)


def test_an_algorithm_defined_by_its_estimator_refuses_another(tmp_path):
    with pytest.raises(ValueError, match="algo=rloo is defined by advantage=rloo"):
        make_trainer(tmp_path, algo="rloo", advantage="grpo")


@pytest.mark.parametrize("algo", ["reinforce", "rloo"])
def test_reinforce_and_rloo_train(tmp_path, algo):
    trainer = make_trainer(tmp_path, algo=algo, prompts_per_step=4, group_size=8,
                           max_new_tokens=4, total_steps=12, lr=1e-2, beta=0.0, micro_batch_size=32, eval_every=0,
                           log_completions_every=0)
    trainer.train()
    rewards = [r["reward/mean"] for r in trainer.metrics_log.records() if "reward/mean" in r]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.3, rewards
