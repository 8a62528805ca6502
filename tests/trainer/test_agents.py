"""Agents in text environments through the whole trainer: groups share their reset, every algorithm
trains on trajectories, the environment's tokens carry no loss, tools, resume, evaluation and GEM."""

from __future__ import annotations

import importlib.util
import re

import pytest
import torch

from grouprl.report.data import read_jsonl
from grouprl.run.logs import PhaseTimer
from tests.helpers.agents import count, make_agent_trainer, train_two_steps
from tests.helpers.trainer import params_of


def test_the_trajectories_of_a_group_start_from_the_same_reset(tmp_path):
    trainer = make_agent_trainer(tmp_path, prompts_per_step=2, group_size=4)
    got = trainer.collector.collect(0, PhaseTimer())
    first = [t[0]["content"] for t in got.batch.extras["trajectory"]]
    assert len(set(first[:4])) == 1 and len(set(first[4:])) == 1 and first[0] != first[4]
    assert first[0].startswith("game ") and got.batch.group_size == 4
    # environment tokens are in the sequence, but only the policy's carry loss
    assert (got.batch.sequence_mask.sum() > got.batch.completion_mask.sum())
    # the return is the sum of the turns' rewards
    steps = got.batch.info["step_rewards"]
    assert got.rewards.tolist() == pytest.approx([sum(s) for s in steps])


@pytest.mark.parametrize("algo", ["grpo", "rloo", "reinforce", "ppo", "trpo"])
def test_every_algorithm_trains_on_trajectories(tmp_path, algo):
    extra = {"critic_warmup_steps": 0} if algo == "ppo" else {"max_kl": 0.05} if algo == "trpo" else {}
    trainer = make_agent_trainer(tmp_path, algo=algo, total_steps=2, **extra)
    records = train_two_steps(trainer)
    for key in ("env/turns_mean", "env/tool_calls_mean", "env/tool_errors", "env/truncated_frac", "env/success"):
        assert key in records[0]


def test_grpo_raises_the_return_of_a_learnable_environment(tmp_path):
    trainer = make_agent_trainer(tmp_path, prompts_per_step=4, group_size=8, total_steps=10, lr=1e-2, beta=0.0)
    trainer.train()
    returns = [r["env/return_mean"] for r in trainer.metrics_log.records() if "env/return_mean" in r]
    assert sum(returns[-3:]) / 3 > sum(returns[:3]) / 3 + 0.3, returns


def test_lora_trains_only_adapters_on_trajectories(tmp_path):
    trainer = make_agent_trainer(tmp_path, lora_rank=4, lr=1e-2, total_steps=1)
    before = params_of(trainer.policy)
    trainer.train()
    moved = [k for k, v in params_of(trainer.policy).items() if not torch.equal(v, before[k])]
    assert moved and all("lora_" in k for k in moved)


def test_tool_calls_are_counted_and_answered(tmp_path):
    trainer = make_agent_trainer(tmp_path, tools=[count], total_steps=1)
    episodes = trainer.collector.episodes([{"seed": 0}], [0], 1)
    episodes[0].start()
    assert episodes[0].respond('<tool_call>{"name": "count", "arguments": {"text": "abc"}}</tool_call>') == \
        [{"role": "tool", "name": "count", "content": "3"}]
    # the renderer shows the tools to the model (the tiny template ignores tools=: a system message)
    assert '"name": "count"' in trainer.sampler.renderer.system


def test_resume_continues_an_agent_run_exactly(tmp_path):
    straight = make_agent_trainer(tmp_path / "a", total_steps=3, save_every=1, mu=2, minibatch_size=4)
    straight.train()
    resumed = make_agent_trainer(tmp_path / "a", total_steps=3, save_every=1, mu=2, minibatch_size=4,
                                 resume_from=str(tmp_path / "a" / "run" / "checkpoints" / "step-000002"))
    want = params_of(straight.policy)
    resumed.train()
    got = params_of(resumed.policy)
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_evaluation_plays_held_out_resets(tmp_path):
    trainer = make_agent_trainer(tmp_path, eval_samples=2)
    result = trainer.evaluate()
    assert set(result) >= {"eval/success", "eval/pass@2", "eval/mean_reward", "eval/turns_mean", "eval/len_mean"}
    assert result == trainer.evaluate()  # the same seeds draw the same trajectories


@pytest.mark.skipif(importlib.util.find_spec("gem") is None,
                    reason="GEM is not installed (pip install 'grouprl[envs]'; the test extra installs it)")
def test_a_gem_environment_end_to_end(tmp_path):
    trainer = make_agent_trainer(tmp_path, env="gem:game:GuessTheNumber-v0-easy", total_steps=2, max_new_tokens=6,
                                 max_turns=2, max_trajectory_tokens=80, max_positions=1024)
    summary = trainer.train()
    assert summary["steps"] == 2
    records = [r for r in trainer.metrics_log.records() if "env/return_mean" in r]
    assert [r["step"] for r in records] == [1, 2]
    record = next(r for r in trainer.completions_log.records() if "trajectory" in r)
    assert record["trajectory"][0]["content"].startswith("You are playing Guess The Number")
    # a random model writes no \boxed{} guess: GEM ends the game on it with its invalid-guess penalty
    assert [m["role"] for m in record["trajectory"]] == ["user", "assistant"]
    assert record["reward"] == pytest.approx(-0.1) and record["end_reason"] == "env"


def test_gigpo_gives_each_turn_its_own_advantage(tmp_path):
    from grouprl.trainer.steps import token_turns

    trainer = make_agent_trainer(tmp_path, advantage="gigpo", gigpo_gamma=0.5, prompts_per_step=2, group_size=4,
                                 total_steps=2, log_completions_every=1)
    got = trainer.collector.collect(0, PhaseTimer())
    mask = got.batch.completion_mask
    data, metrics, _ = trainer.baseline.prepare(got, mask, None, None, 0.0, 0)
    assert data.advantages.shape == mask.shape and set(metrics) == {
        "gigpo/step_groups", "gigpo/step_group_size_mean", "gigpo/singleton_frac"}
    turns = token_turns(mask)
    assert ((data.advantages != 0) <= (turns >= 0)).all()  # environment tokens carry no advantage
    for i in range(got.batch.batch_size):  # one value per turn, constant over the turn's tokens
        for t in range(int(turns[i].max()) + 1):
            assert data.advantages[i][turns[i] == t].unique().numel() == 1
    # every trajectory of a reset starts from the same state: the first turns form one anchor group
    assert metrics["gigpo/step_groups"] >= 2
    trainer.train()
    record = next(r for r in trainer.metrics_log.records() if "gigpo/step_groups" in r)
    assert record["step"] == 1
    # the samples say which turns were compared, and the report draws one group of them
    samples = read_jsonl(tmp_path / "run" / "completions.jsonl")
    first = samples[0]
    assert len(first["step_groups"]) == len(first["turn_advantages"]) == len(first["state_keys"]) == first["turns"]
    group = [r for r in samples if r["step"] == first["step"] and r["prompt"] == first["prompt"]]
    assert len({r["step_groups"][0] for r in group}) == 1 and first["state_keys"][0].startswith("game")
    from grouprl.report import write_report

    html = write_report(tmp_path / "run").read_text()
    assert "Step groups (GiGPO)" in html and "<b>A</b>" in html


def test_state_keys_group_equal_or_similar_texts_within_a_reset():
    from grouprl.trainer.steps import key_ids

    keys = [["a long observation text", "x"], ["a long observation text!", None], ["a long observation text", "x"]]
    exact = key_ids(keys, [0, 0, 1], None)
    assert exact[0][0] != exact[1][0] and exact[1][1] == -1 and exact[2][0] != exact[0][0]
    close = key_ids(keys, [0, 0, 1], 0.95)
    assert close[0][0] == close[1][0] and close[2][0] != close[0][0]


def test_a_first_prompt_that_leaves_no_room_for_the_trajectory_is_named(tmp_path):
    from grouprl.errors import PromptTooLongError

    trainer = make_agent_trainer(tmp_path, max_trajectory_tokens=500)  # the tiny model holds 512 positions
    with pytest.raises(PromptTooLongError, match="first prompt for seed .* max_trajectory_tokens=500") as caught:
        trainer.train()
    tokens, bound = map(int, re.search(r"is (\d+) tokens.*to at most (\d+) ", str(caught.value)).groups())
    assert tokens + bound <= 512 and bound < 500  # the room the longest first prompt leaves
    make_agent_trainer(tmp_path / "fits", max_trajectory_tokens=bound).train()


def test_a_judge_ranks_the_trajectories_of_each_reset(tmp_path):
    seen = []

    def judge(prompt, completions, seed):
        seen.append((seed, len(completions)))
        return [float(sum(ch.isdigit() for ch in c)) for c in completions]

    trainer = make_agent_trainer(tmp_path, judge=judge, judge_weight=2.0, prompts_per_step=2, group_size=3)
    metrics, records = trainer.step()
    assert len(seen) == 2 and all(n == 3 for _, n in seen)  # one call per reset, its G trajectories
    assert len({s for s, _ in seen}) == 2  # each group's row: its reset seed
    assert metrics["judge/dropped_groups"] == 0.0
    # reward = the environment's return + 2 * the judge's score, the return kept as reward/independent
    assert metrics["reward/mean"] == pytest.approx(metrics["reward/independent"] + 2 * metrics["reward/judge"])
    assert len(records) == 6 and all(set(r["rewards"]) == {"env", "judge", "independent"} for r in records)
    for r in records:  # each sample shows the judge's score beside the independent reward
        assert r["reward"] == pytest.approx(r["rewards"]["independent"] + 2 * r["rewards"]["judge"])


def test_a_judge_of_agents_reads_whole_trajectories(tmp_path):
    seen = []

    def judge(prompt, completions, **_):
        seen.extend(completions)
        return [0.0] * len(completions)

    trainer = make_agent_trainer(tmp_path, judge=judge, prompts_per_step=1, group_size=2, max_turns=3)
    trainer.step()
    turns = [t.split("\n\n") for t in seen]
    assert turns and all(t[0].startswith("assistant: ") for t in turns)
    # several turns with the environment's replies between them, not the last answer alone
    assert any(len(t) >= 3 and t[1].startswith("user: ") and t[2].startswith("assistant: ") for t in turns)



def test_reward_functions_score_the_final_answer_and_see_the_whole_trajectory(tmp_path):
    """reward = the environment's return + the weighted reward functions, which get the last answer as
    the completion and the trajectory's messages as the ``trajectory`` column."""
    seen = []

    def turns_taken(prompts, completions, trajectory):
        seen.append((list(completions), trajectory))
        return [float(sum(m["role"] == "assistant" for m in t)) for t in trajectory]

    trainer = make_agent_trainer(tmp_path, reward_fns=[turns_taken], reward_weights=[0.5], prompts_per_step=2,
                                 group_size=2, max_turns=3)
    metrics, records = trainer.step()
    completions, trajectories = seen[0]
    assert len(trajectories) == 4 and all(isinstance(m, dict) for t in trajectories for m in t)
    for text, messages in zip(completions, trajectories):  # the completion is the trajectory's last answer
        assert text == [m["content"] for m in messages if m["role"] == "assistant"][-1]
    assert metrics["reward/turns_taken"] == pytest.approx(metrics["env/turns_mean"])
    for r in records:
        assert r["reward"] == pytest.approx(r["rewards"]["env"] + 0.5 * r["rewards"]["turns_taken"])


def test_trajectories_whose_environment_raised_leave_the_batch_and_the_run_goes_on(tmp_path):
    from tests.helpers.agents import BreaksEveryThird

    trainer = make_agent_trainer(tmp_path, env="tests.helpers.agents:BreaksEveryThird", prompts_per_step=3,
                                 group_size=4, total_steps=2, beta=0.0)
    before = params_of(trainer.policy)
    BreaksEveryThird.made = 0  # counted from the step's first environment
    collected = trainer.collector.collect(1, PhaseTimer())
    # 12 trajectories, every third broken: 8 stay, in groups of the resets they came from (sizes 3, 3, 2)
    assert collected.batch.batch_size == 8
    assert collected.batch.group_ids.tolist() == [0, 0, 0, 1, 1, 1, 2, 2]
    trainer.train()
    after = params_of(trainer.policy)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    records = [r for r in trainer.metrics_log.records() if "env/return_mean" in r]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["env/ended_error"] == pytest.approx(1 / 3) for r in records)


def test_an_opening_with_a_worked_example_stays_the_resets_own(tmp_path):
    """A few-shot opening's assistant turn is context: not the policy's in the judge's transcript, in the
    report, or in the group's prompt, which is the opening's last question."""
    from grouprl.report.html import _trajectory

    seen = []

    def judge(prompt, completions, **_):
        seen.append((prompt, list(completions)))
        return [0.0] * len(completions)

    trainer = make_agent_trainer(tmp_path, env="tests.helpers.agents:FewShotDigitTalk", judge=judge,
                                 prompts_per_step=2, group_size=2)
    metrics, records = trainer.step()
    assert all(r["opening"] == 3 and r["trajectory"][1]["content"] == "EXAMPLE-123" for r in records)
    assert all(r["prompt"].startswith("game ") for r in records)
    assert seen and all(prompt.startswith("game ") for prompt, _ in seen)
    texts = [t for _, completions in seen for t in completions]
    assert all(t.startswith("assistant: ") and "EXAMPLE-123" not in t and "example: digits" not in t for t in texts)
    html = _trajectory(records[0]["trajectory"], records[0]["opening"])
    assert html.count('class="turn policy"') == sum(m["role"] == "assistant" for m in records[0]["trajectory"]) - 1
    assert '<div class="turn env"><div class="role">assistant</div><pre>EXAMPLE-123</pre>' in html
