"""grouprl compare: per-algorithm configs from the shared one, the table's numbers, and end to end."""

import json

import pytest

from grouprl.cli import main
from grouprl.cli.compare import CompareConfig, lm_algorithm_config
from grouprl.config import TrainConfig
from grouprl.report.comparison_table import comparison_table


def test_every_algorithm_gets_the_shared_settings_and_its_own_definition():
    run = TrainConfig(model="tiny", prompts_per_step=3, group_size=4, total_steps=7, lr=2e-5, beta=0.02, seed=5)
    for algo in ("grpo", "reinforce", "rloo", "ppo", "trpo"):
        cfg = lm_algorithm_config(run, algo, {})
        assert (cfg.prompts_per_step, cfg.group_size, cfg.total_steps, cfg.lr, cfg.beta, cfg.seed) == \
            (3, 4, 7, 2e-5, 0.02, 5), algo
    rloo = lm_algorithm_config(run, "rloo", {})
    assert rloo.algo == "rloo" and rloo.advantage_estimator == "rloo"
    assert rloo.advantage_scale is None  # empty: RLOO's own definition, no std division
    assert lm_algorithm_config(run, "grpo", {}).advantage_scale in (None, "group")  # None: grpo's own
    ppo = lm_algorithm_config(run, "ppo", {"vf_coef": 0.3})
    assert ppo.algo == "ppo" and ppo.vf_coef == 0.3 and ppo.kl_penalty_in_reward  # PPO keeps the KL in the reward
    assert lm_algorithm_config(run, "trpo", {"max_kl": 0.05}).max_kl == 0.05
    with pytest.raises(ValueError, match="trpo: vf_coef=0.3 is a setting of ppo"):
        lm_algorithm_config(run, "trpo", {"vf_coef": 0.3})
    with pytest.raises(ValueError, match="algo_options.ppo: vf_coeff is not a train option"):
        lm_algorithm_config(run, "ppo", {"vf_coeff": 0.3})


def test_compare_config_errors():
    with pytest.raises(ValueError, match="dqn not available for language models"):
        CompareConfig(algos=("grpo", "dqn"))
    with pytest.raises(ValueError, match="vpg not available for language models"):
        CompareConfig(algos=("vpg",))
    with pytest.raises(ValueError, match="algo_options for ppo, which is not in algos"):
        CompareConfig(algos=("grpo",), algo_options={"ppo": {}})


def test_a_folder_holding_earlier_runs_is_refused_before_any_run_or_replaced(tmp_path, capsys, monkeypatch):
    out = tmp_path / "cmp"
    old = out / "grpo-seed0"
    (old / "checkpoints").mkdir(parents=True)
    (old / "metrics.jsonl").write_text('{"step": 1}\n')
    args = ["compare", "--algos", "grpo,rloo", "--model", "tiny", "--total_steps", "1", "--output_dir", str(out)]
    started = []
    monkeypatch.setattr("grouprl.cli.compare._in_child", lambda target, run, *rest: started.append(run.output_dir))
    monkeypatch.setattr("grouprl.report.comparison_table.summarize_runs",
                        lambda *a, **k: pytest.fail("no table expected"))

    assert main(args) == 2
    err = capsys.readouterr().err
    assert "holds runs (grpo-seed0)" in err and "--overwrite" in err
    assert started == [] and (old / "metrics.jsonl").exists()  # refused before the first run

    class Started(Exception):
        pass

    def first_run(target, run, *rest):
        assert not (old / "metrics.jsonl").exists() and not (old / "checkpoints").exists()
        raise Started

    monkeypatch.setattr("grouprl.cli.compare._in_child", first_run)
    with pytest.raises(Started):
        main([*args, "--overwrite", "--debug"])


def test_rl_refuses_a_folder_holding_an_earlier_run(tmp_path, capsys):
    pytest.importorskip("gymnasium")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    assert main(["rl", "--env", "CartPole-v1", "--output_dir", str(tmp_path)]) == 2
    assert "already holds a run" in capsys.readouterr().err


def run_numbers(algo, seed, **values):
    base = {"algo": algo, "seed": seed, "eval_key": "eval/accuracy", "curves": {}}
    return {**base, **values}


def test_table_averages_seeds_with_their_spread():
    runs = [run_numbers("grpo", 0, eval_after=0.5, peak_rss_mb=1000.0, throughput=None),
            run_numbers("grpo", 1, eval_after=0.7, peak_rss_mb=1100.0, throughput=None),
            run_numbers("ppo", 0, eval_after=0.4, peak_rss_mb=2000.0, throughput=10.0)]
    table = comparison_table(runs, control=False)
    grpo = next(line for line in table.splitlines() if line.startswith("| grpo"))
    ppo = next(line for line in table.splitlines() if line.startswith("| ppo"))
    # mean 0.6, population spread 0.1; memory 1050 +- 50; an unknown throughput shows as -
    assert "| grpo | 2 | - | 0.600 ± 0.100 |" in grpo and "| 1050 ± 50 |" in grpo and "| - |" in grpo
    assert "| ppo | 1 | - | 0.400 |" in ppo and "| 2000 |" in ppo and "| 10 |" in ppo


def test_table_and_plots_from_real_control_runs(tmp_path):
    pytest.importorskip("gymnasium")
    from grouprl.control import ControlConfig, GRPOControlConfig
    from grouprl.control.training import ControlTrainer
    from grouprl.report.comparison_table import summarize_runs, write_comparison

    jobs = []
    for algo in ("grpo", "vpg"):
        folder = tmp_path / algo
        ControlTrainer(ControlConfig(algo=algo, total_env_steps=150, eval_episodes=2, eval_every_env_steps=50,
                                     hidden_sizes=(8,), stop_at_return=1.0 if algo == "vpg" else None,
                                     grpo=GRPOControlConfig(prompts_per_step=2, group_size=2, minibatch_size=4),
                                     output_dir=str(folder), progress=False, tensorboard=False)).train()
        jobs.append((algo, 0, folder))
    runs = summarize_runs(jobs, control=True)
    table = write_comparison(runs, tmp_path, control=True).read_text()
    grpo, vpg = runs
    assert grpo["solved_at"] is None and vpg["solved_at"] == 0 and vpg["wall_to_solve_s"] == 0.0
    assert grpo["env_steps"] >= 150 and len(grpo["curves"]["eval_x"][0]) >= 3  # before, during, after
    assert "| vpg | 1 | 0 | 0.0 |" in table and "| grpo | 1 | - | - |" in table
    assert all((tmp_path / "plots" / f"{name}.png").exists() for name in ("eval", "reward", "kl", "cost"))


@pytest.mark.slow
def test_classic_control_comparison_end_to_end(tmp_path):
    pytest.importorskip("gymnasium")
    out = tmp_path / "cmp"
    status = main(["compare", "--env", "CartPole-v1", "--algos", "grpo,ppo", "--output_dir", str(out),
                   "--total_env_steps", "200", "--eval_episodes", "2", "--eval_every_env_steps", "0",
                   "--hidden_sizes", "8", "--no-progress", "--no-tensorboard", "--grpo.prompts_per_step", "2",
                   "--grpo.group_size", "2", "--grpo.minibatch_size", "4", "--ppo.num_envs", "2",
                   "--ppo.steps_per_env", "50"])
    assert status == 0
    table = (out / "comparison.md").read_text()
    assert "| grpo | 1 |" in table and "| ppo | 1 |" in table and "env steps to solve" in table
    for name in ("eval", "reward", "kl", "cost"):
        assert (out / "plots" / f"{name}.png").exists()
    numbers = {r["algo"]: r for r in json.loads((out / "comparison.json").read_text())}
    for algo in ("grpo", "ppo"):
        assert (out / f"{algo}-seed0" / "report" / "report.html").exists()
        assert numbers[algo]["env_steps"] >= 200 and numbers[algo]["peak_rss_mb"] > 50
        assert numbers[algo]["eval_after"] > 0


@pytest.mark.slow
def test_language_model_comparison_end_to_end(tmp_path):
    out = tmp_path / "cmp"
    status = main(["compare", "--algos", "grpo,rloo,ppo,trpo", "--output_dir", str(out), "--model", "tiny",
                   "--task", "arithmetic", "--total_steps", "2", "--prompts_per_step", "2", "--group_size", "2",
                   "--max_new_tokens", "4", "--eval_size", "4", "--eval_samples", "1", "--no-progress",
                   "--beta", "0.04", "--zero_std_groups", "keep"])
    # keep: the tiny model never earns a reward, so under drop every group would leave the loss and
    # TRPO would skip its step; with keep the KL term still gives each update something to do
    assert status == 0
    numbers = {r["algo"]: r for r in json.loads((out / "comparison.json").read_text())}
    assert set(numbers) == {"grpo", "rloo", "ppo", "trpo"}
    # each algorithm ran its own update: PPO trained a critic, TRPO took trust-region steps, the
    # group-relative ones did neither (peak RSS cannot tell: the tiny critic is below process noise)
    def keys(algo):
        lines = (out / f"{algo}-seed0" / "metrics.jsonl").read_text().splitlines()
        return set().union(*(json.loads(line) for line in lines))
    assert "loss/value" in keys("ppo") and "trpo/fvp_calls" in keys("trpo")
    assert not {"loss/value", "trpo/fvp_calls"} & (keys("grpo") | keys("rloo"))
    assert all(numbers[a]["peak_rss_mb"] > 50 for a in numbers)



@pytest.mark.parametrize("command", [["compare", "--algos", "grpo,rloo"], ["train"]])
def test_the_command_starts_again_under_the_allocator_setting(command, tmp_path, monkeypatch):
    class Restarted(Exception):
        pass

    calls, ran = [], []

    def restart(setting, argv):
        calls.append((setting, argv[1:]))
        raise Restarted

    monkeypatch.setattr("grouprl.run.allocator.restart_with_allocator", restart)
    monkeypatch.setattr("grouprl.cli.compare.run_compare", lambda compare, base, **k: ran.append(base.allocator))
    monkeypatch.setattr("grouprl.cli.commands.train", lambda config, **k: ran.append(config.allocator))
    argv = [*command, "--model", "tiny", "--allocator", "system", "--output_dir", str(tmp_path), "--debug"]
    monkeypatch.setattr("sys.argv", ["grouprl", *argv])
    with pytest.raises(Restarted):
        main()  # as the program: it may replace its process
    assert calls == [("system", ["-m", "grouprl", *argv])] and ran == []
    calls.clear()
    assert main(argv) == 0  # called from Python: its process is not the command's to replace
    assert calls == [] and ran == ["system"]


def test_a_control_comparison_keeps_its_process(monkeypatch):
    pytest.importorskip("gymnasium")
    ran = []
    monkeypatch.setattr("grouprl.run.allocator.restart_with_allocator", lambda *a: ran.append("restarted"))
    monkeypatch.setattr("grouprl.cli.compare.run_compare", lambda compare, base, **k: ran.append(base.env))
    argv = ["compare", "--env", "CartPole-v1", "--algos", "grpo", "--debug"]
    monkeypatch.setattr("sys.argv", ["grouprl", *argv])
    assert main() == 0
    assert ran == ["CartPole-v1"]  # classic control has no allocator setting
