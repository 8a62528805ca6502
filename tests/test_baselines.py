"""REINFORCE (group-mean baseline) and RLOO are advantage estimators of the GRPO trainer, not
trainers of their own: they differ from GRPO only in the advantage, and they train."""

import pytest
import torch

from grouprl.algos import compute_advantages
from grouprl.trainer.metrics import PhaseTimer
from tests.trainer_helpers import make_trainer


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_estimators_reach_the_update_through_the_config(tmp_path):
    # The same rollout, three estimators: the update sees exactly compute_advantages(name, ...).
    seen = {}
    for name in ("grpo", "reinforce", "rloo"):
        trainer = make_trainer(tmp_path / name, advantage=name, advantage_scale="group" if name == "grpo" else "none",
                               beta=0.0)

        def capture(batch, advantages, *args, _name=name, **kwargs):
            seen[_name] = advantages
            return {}

        trainer.update = capture
        trainer.step()
    batch, rewards, _, _ = make_trainer(tmp_path / "again", beta=0.0).sample_and_score(PhaseTimer())
    for name, scale in (("grpo", "group"), ("reinforce", "none"), ("rloo", "none")):
        torch.testing.assert_close(seen[name], compute_advantages(name, rewards, 4, scale))
    # RLOO is REINFORCE scaled by G / (G - 1) within each group
    torch.testing.assert_close(seen["rloo"], seen["reinforce"] * 4 / 3)


@pytest.mark.parametrize("advantage", ["reinforce", "rloo"])
def test_reinforce_and_rloo_train(tmp_path, advantage):
    trainer = make_trainer(tmp_path, advantage=advantage, advantage_scale="none", prompts_per_step=4, group_size=8,
                           max_new_tokens=4, total_steps=12, lr=1e-2, beta=0.0, micro_batch_size=32, eval_every=0,
                           log_completions_every=0)
    trainer.train()
    rewards = [r["reward/mean"] for r in trainer.metrics_log.records() if "reward/mean" in r]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.3, rewards
