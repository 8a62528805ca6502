"""The classic-control trainer: run folder, metrics, evaluation schedule, checkpoints, resume,
determinism, each algorithm and action space end to end on a small budget."""

import json
import re
import warnings
from dataclasses import replace

import pytest
import torch

pytest.importorskip("gymnasium")

from grouprl.control import ControlConfig  # noqa: E402
from grouprl.control.training import ControlTrainer  # noqa: E402
from grouprl.report import write_report  # noqa: E402
from grouprl.report.data import read_jsonl  # noqa: E402
from grouprl.run.checkpoint_files import checkpoint_dirs  # noqa: E402

SMALL = {"grpo": {"prompts_per_step": 2, "group_size": 2, "minibatch_size": 4},
         "ppo": {"num_envs": 2, "steps_per_env": 32}, "trpo": {"num_envs": 2, "steps_per_env": 32},
         "vpg": {"num_envs": 2, "steps_per_env": 32}}


def small_config(tmp_path, algo="ppo", env="CartPole-v1", **overrides) -> ControlConfig:
    cfg = ControlConfig(env=env, algo=algo, total_env_steps=300, eval_every_env_steps=128, eval_episodes=2,
                        hidden_sizes=(16,), output_dir=str(tmp_path / algo), progress=False, tensorboard=False)
    cfg = replace(cfg, **{algo: replace(getattr(cfg, algo), **SMALL[algo])})
    return replace(cfg, **overrides)


@pytest.mark.parametrize("algo", ["grpo", "ppo", "trpo", "vpg"])
def test_each_algorithm_writes_a_run_folder_with_the_shared_metric_names(tmp_path, algo):
    cfg = small_config(tmp_path, algo)
    summary = ControlTrainer(cfg).train()
    out = tmp_path / algo
    records = read_jsonl(out / "metrics.jsonl")
    train = [r for r in records if "time/step" in r]
    evals = [r for r in records if "eval/mean_reward" in r]
    assert summary["env_steps"] >= 300 and summary["env_steps"] == train[-1]["rollout/env_steps"]
    assert train[0]["rollout/env_steps"] < 300  # it took several iterations
    for key in ("policy/kl", "time/rollout", "time/update", "throughput/env_steps_per_s", "memory/peak_rss_mb",
                "wall_time", "step"):
        assert key in train[-1], key
    assert any("reward/mean" in r for r in train)
    # evaluated before, after the first iteration past each 128 steps, and at the end
    steps_at_eval = [r["eval/env_steps"] for r in evals]
    assert steps_at_eval[0] == 0 and steps_at_eval[-1] == summary["env_steps"] and len(steps_at_eval) >= 3
    assert all(0 < r["eval/mean_reward"] <= 500 for r in evals)
    assert checkpoint_dirs(out / "checkpoints")[-1].name == f"step-{summary['steps']:06d}"
    if algo == "ppo":  # the report is the language-model one (matplotlib takes seconds: once is enough)
        report = write_report(out)
        assert report.exists() and all((out / "report" / f).exists() for f in ("reward.png", "kl.png", "time.png"))


@pytest.mark.parametrize("algo", ["ppo", "trpo"])
def test_gaussian_policy_on_pendulum(tmp_path, algo):
    summary = ControlTrainer(small_config(tmp_path, algo, env="Pendulum-v1", total_env_steps=400,
                                          eval_every_env_steps=0)).train()
    assert summary["env_steps"] >= 400 and summary["eval_after"]["eval/mean_reward"] < 0  # Pendulum pays <= 0


def test_grpo_on_acrobot_uses_whole_episodes(tmp_path):
    cfg = small_config(tmp_path, "grpo", env="Acrobot-v1", total_env_steps=1, eval_every_env_steps=0)
    trainer = ControlTrainer(cfg)
    summary = trainer.train()
    # one iteration: 2 groups x 2 episodes, each run to its end (at most 500 steps)
    assert summary["steps"] == 1 and 4 <= summary["env_steps"] <= 2000
    record = next(r for r in read_jsonl(tmp_path / "grpo" / "metrics.jsonl") if "reward/mean" in r)
    assert record["rollout/episodes"] == 4 and record["rollout/len_mean"] * 4 == summary["env_steps"]


def test_same_seed_same_run_and_stop_at_return(tmp_path):
    def numbers(folder):
        return [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/", "memory/", "wall_time"))}
                for r in read_jsonl(folder / "metrics.jsonl")]

    a = ControlTrainer(small_config(tmp_path, "ppo", output_dir=str(tmp_path / "a"))).train()
    b = ControlTrainer(small_config(tmp_path, "ppo", output_dir=str(tmp_path / "b"))).train()
    assert numbers(tmp_path / "a") == numbers(tmp_path / "b") and a["env_steps"] == b["env_steps"]
    # a return even the initial policy reaches: solved at the evaluation before training, no iteration runs
    stopped = ControlTrainer(small_config(tmp_path, "ppo", output_dir=str(tmp_path / "c"), stop_at_return=1.0,
                                          total_env_steps=10_000)).train()
    assert stopped["solved_at_env_steps"] == 0 and stopped["steps"] == 0


def test_resume_continues_the_budget_from_the_checkpoint(tmp_path):
    first = ControlTrainer(small_config(tmp_path, "vpg", total_env_steps=128, save_every=1))
    assert first.train()["env_steps"] == 128 and first.step_count == 2  # 2 envs x 32 steps per iteration
    resumed = ControlTrainer(small_config(tmp_path, "vpg", total_env_steps=256, resume_from="latest"))
    resumed.resume("latest")
    assert (resumed.step_count, resumed.env_steps) == (2, 128)
    for key, value in first.agent.state_dict().items():
        assert torch.equal(resumed.agent.state_dict()[key], value), key
    summary = resumed.train()
    assert summary["steps"] == 4 and summary["env_steps"] == 256
    steps = [r["step"] for r in read_jsonl(tmp_path / "vpg" / "metrics.jsonl") if "time/step" in r]
    assert steps == [1, 2, 3, 4]  # nothing repeated, nothing lost
    saved = json.loads((checkpoint_dirs(tmp_path / "vpg" / "checkpoints")[-1] / "state.json").read_text())
    assert saved["env_steps"] == 256


@pytest.mark.parametrize("overrides, message", [
    ({"algo": "dqn"}, "algo='dqn' is not one of: grpo, ppo, trpo, vpg"),
    ({"env": "CartPol-v1"}, "Did you mean: `CartPole`"),
    ({"gamma": 1.5}, "gamma=1.5"),
])
def test_config_errors_name_the_field(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ControlConfig(**overrides)


def test_wall_clock_budget_stops_the_loop(tmp_path):
    trainer = ControlTrainer(small_config(tmp_path, "ppo", total_env_steps=10**6, eval_every_env_steps=0))
    trainer.time_budget_s = 0.0  # spent before the first iteration
    summary = trainer.train()
    assert summary["steps"] == 0 and summary["env_steps"] == 0 and "eval/mean_reward" in summary["eval_after"]


def test_the_earlier_knob_names_still_work_with_a_deprecation_warning():
    from grouprl.config import load_config

    old = ["--grpo.groups_per_step", "2", "--grpo.group_size", "4", "--grpo.minibatches", "2", "--ppo.epochs", "3",
           "--ppo.clip", "0.1", "--no-ppo.normalize_advantages", "--ppo.num_envs", "4", "--ppo.minibatches", "8"]
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        c = load_config(ControlConfig, None, old)
    renamed = sorted(str(w.message).split("'")[1] for w in said if issubclass(w.category, FutureWarning))
    assert renamed == ["grpo.groups_per_step", "grpo.minibatches", "ppo.clip", "ppo.epochs", "ppo.minibatches",
                       "ppo.normalize_advantages"]
    # minibatches was a count; minibatch_size is rows: 2*4 episodes / 2, and 4*128 steps / 8
    assert (c.grpo.prompts_per_step, c.grpo.minibatch_size) == (2, 4)
    assert (c.ppo.mu, c.ppo.eps_low, c.ppo.whiten_advantages, c.ppo.minibatch_size) == (3, 0.1, False, 64)
    with pytest.warns(FutureWarning, match="'vpg.normalize_advantages' is now 'vpg.whiten_advantages'"):
        assert load_config(ControlConfig, None, ["--vpg.normalize_advantages", "false"]).vpg.whiten_advantages is False
