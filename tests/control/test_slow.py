"""Each algorithm solves CartPole-v1 (greedy mean return >= 475 over 20 held-out evaluation episodes)
within a stated budget of environment steps, seeded, with the default settings of its section.

Slow: run with ``pytest -m slow tests/test_envs_slow.py`` (about 3-5 minutes on a 2-core CPU). The
budgets are about twice the steps-to-solve measured over seeds 0-3 (README), so a change that makes
an algorithm markedly less sample-efficient fails here.
"""

import pytest

pytest.importorskip("gymnasium")

from grouprl.control import ControlConfig  # noqa: E402
from grouprl.control.training import ControlTrainer  # noqa: E402

BUDGETS = {"ppo": 100_000, "trpo": 100_000, "vpg": 150_000, "grpo": 200_000}
"""Environment steps each algorithm gets; measured steps-to-solve at seeds 0-3 are in the README."""


@pytest.mark.slow
@pytest.mark.parametrize("algo", sorted(BUDGETS))
def test_solves_cartpole_within_budget(tmp_path, algo):
    cfg = ControlConfig(env="CartPole-v1", algo=algo, seed=0, total_env_steps=BUDGETS[algo], stop_at_return=475.0,
                        eval_every_env_steps=5000, eval_episodes=20, output_dir=str(tmp_path / algo), progress=False,
                        tensorboard=False)
    summary = ControlTrainer(cfg).train()
    assert summary["solved_at_env_steps"] is not None, f"{algo} did not reach 475 in {BUDGETS[algo]} steps"
    assert summary["eval_after"]["eval/mean_reward"] >= 475.0
