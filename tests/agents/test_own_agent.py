"""Agents written with the ``openai`` package, trained through the run's chat endpoint on the built-in engine: what
they are trained on is what was sampled, a rewritten history splits a trajectory, and failing agents are dropped."""

from __future__ import annotations

import pytest
import torch

from grouprl.algos import group_advantages
from grouprl.envs.tools import Tool, tools_system_prompt
from grouprl.errors import EnvError
from grouprl.rollout.agent import ChatRenderer
from grouprl.run.logs import JsonlLog, PhaseTimer
from grouprl.trainer.advantages import GroupBaseline
from tests.helpers import own_agents
from tests.helpers.own_agents import TOOLS, make_agent_run, policy_turns


def recording(trainer):
    """Every engine call's sampled ids (per row, as the engine returned them), appended as the endpoint samples."""
    endpoint = trainer.source.collector.endpoint
    sampled, generate = [], endpoint.engine.generate

    def generate_and_record(prompt_ids, group_size, params, **kw):
        out = generate(prompt_ids, group_size, params, **kw)
        for i in range(len(prompt_ids)):
            n = int(out.completion_mask[i].sum())
            sampled.append((out.completion_ids[i, :n].tolist(), out.sampling_logprobs[i, :n].tolist()))
        return out

    endpoint.engine = type("Recorded", (), {"generate": staticmethod(generate_and_record)})()
    return sampled


@pytest.mark.slow
def test_an_openai_agent_with_two_tools_trains_for_two_steps_on_the_tokens_it_was_served(tmp_path):
    trainer = make_agent_run(tmp_path, own_agents.tool_agent, prompts_per_step=2, group_size=4, total_steps=2)
    start = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    sampled = recording(trainer)
    got = trainer.collector.collect(0, PhaseTimer())
    batch = got.batch
    assert batch.batch_size == 8 and got.metrics["agent/split_share"] == 0.0  # the template here is append-only
    assert got.metrics["agent/calls_mean"] == 3.0 and len(sampled) == 24
    renderer = ChatRenderer(trainer.tokenizer, [Tool(None, t) for t in TOOLS], None,
                            tools_system_prompt([Tool(None, t) for t in TOOLS]))
    served = {tuple(ids): logp for ids, logp in sampled}
    for i in range(8):
        n = int(batch.sequence_mask[i].sum())
        tokens = batch.completion_ids[i, :n]
        policy = batch.completion_mask[i, :n] > 0
        turns = policy_turns(batch, i)
        assert len(turns) == 3 and all(tuple(t) in served for t in turns)  # trained = sampled, turn for turn
        assert batch.sampling_logprobs[i, :n][policy].tolist() == [lp for t in turns for lp in served[tuple(t)]]
        # and the whole row is what the chat template renders of the finished conversation
        prompt = batch.prompt_ids[i][batch.prompt_mask[i] > 0].tolist()
        conversation = batch.extras["trajectory"][i]
        assert prompt + tokens.tolist() == renderer.prompt_ids(conversation[:-1]) + turns[-1]
        assert got.rewards[i] == pytest.approx(sum(c.isdigit() for c in conversation[-1]["content"])
                                               / max(len(conversation[-1]["content"]), 1))
    trainer.train()
    trainer.close()
    moved = [k for k, v in trainer.policy.state_dict().items() if not torch.equal(v, start[k])]
    assert moved
    steps = [r for r in JsonlLog(tmp_path / "run" / "metrics.jsonl").records() if "reward/agent" in r]
    assert len(steps) == 2 and all(r["agent/dropped"] == 0.0 and 0 <= r["reward/mean"] <= 1 for r in steps)


def test_a_rewritten_history_splits_the_trajectory_and_both_parts_carry_its_advantage(tmp_path):
    trainer = make_agent_run(tmp_path, own_agents.rewriting_agent, prompts_per_step=2, group_size=4)
    got = trainer.collector.collect(0, PhaseTimer())
    batch = got.batch
    assert got.metrics["agent/split_share"] == 1.0 and batch.batch_size == 16
    index = batch.info["trajectory_index"]
    assert index == [k for k in range(8) for _ in range(2)]
    data, _, _ = GroupBaseline(trainer.config, lambda x: x).prepare(got, batch.completion_mask, None, None, 0.0, 0)
    per_trajectory = got.rewards[::2]
    expected = group_advantages(per_trajectory, 4)  # each trajectory counted once in its group
    assert torch.allclose(data.advantages[::2], expected) and torch.allclose(data.advantages[1::2], expected)
    assert torch.equal(got.rewards[::2], got.rewards[1::2])
    # the second part opens with the rewritten history, not the first answer
    second = batch.prompt_ids[1][batch.prompt_mask[1] > 0]
    assert "chars]" in trainer.tokenizer.decode(second)


def test_failing_agents_are_dropped_and_named(tmp_path):
    trainer = make_agent_run(tmp_path, own_agents.raising_agent, prompts_per_step=4, group_size=2, max_new_tokens=2)
    with pytest.warns(UserWarning, match=r"task row \d+\): the agent raised RuntimeError: odd row"):
        got = trainer.collector.collect(0, PhaseTimer())
    assert got.metrics["agent/dropped"] == 4.0 and got.batch.batch_size == 4
    assert sorted(set(got.rewards.tolist())) == [0.0, 2.0]
    assert got.batch.group_index().tolist() == [0, 0, 1, 1]


@pytest.mark.parametrize("agent", [own_agents.hanging_agent, own_agents.hanging_plain_agent])
def test_an_agent_past_its_timeout_is_dropped(tmp_path, agent):
    trainer = make_agent_run(tmp_path, agent, rows=2, prompts_per_step=2, group_size=2, max_new_tokens=2,
                             agent_timeout=1.5)
    with pytest.warns(UserWarning, match=r"ran past agent_timeout \(1.5 s\)"):
        got = trainer.collector.collect(0, PhaseTimer())
    assert got.metrics["agent/dropped"] == 2.0 and got.rewards.tolist() == [0.0, 0.0]


def test_an_agent_that_never_calls_the_model_is_dropped_and_a_batch_of_failures_stops(tmp_path):
    trainer = make_agent_run(tmp_path, own_agents.silent_agent, rows=2, prompts_per_step=2, group_size=2,
                             max_new_tokens=2)
    with pytest.warns(UserWarning, match="never called the model"):
        got = trainer.collector.collect(0, PhaseTimer())
    assert got.metrics["agent/dropped"] == 2.0 and got.batch.batch_size == 2
    trainer = make_agent_run(tmp_path, own_agents.raising_agent, rows=1, prompts_per_step=1, group_size=2,
                             max_new_tokens=2, seed=4)
    trainer.collector.rows = [{"x": 1}]
    with pytest.warns(UserWarning), pytest.raises(EnvError, match="every one of the 2 agent trajectories"):
        trainer.collector.collect(0, PhaseTimer())


def test_an_agent_returning_none_is_scored_by_the_reward_functions(tmp_path):
    trainer = make_agent_run(tmp_path, own_agents.last_answer_agent, reward_fns=[own_agents.digits],
                             prompts_per_step=1, group_size=2, max_new_tokens=4)
    got = trainer.collector.collect(0, PhaseTimer())
    last = [t[-1]["content"] for t in got.batch.extras["trajectory"]]
    assert got.rewards.tolist() == pytest.approx(own_agents.digits(None, last))
    assert torch.isnan(got.per_fn["agent"]).all() and got.per_fn["digits"].tolist() == pytest.approx(got.rewards)


def test_an_agents_answer_a_reward_service_leaves_unscored_gets_no_reward_and_is_counted(tmp_path):
    from grouprl.rewards.remote import RemoteReward
    from tests.helpers.reward_service import Stub, stub_service

    def second_fails(body):  # one trajectory a request (batch_size 1): the second gets a 503
        return (503, {}) if len(stub.requests) == 2 else (200, {"scores": [1.0]})

    stub = Stub([second_fails])
    with stub_service(stub) as url:
        trainer = make_agent_run(tmp_path, own_agents.last_answer_agent,
                                 reward_fns=[RemoteReward(url, batch_size=1, retries=0)], prompts_per_step=1,
                                 group_size=2, max_new_tokens=4)
        with pytest.warns(RuntimeWarning, match="1 of the 2 rows"):
            got = trainer.collector.collect(0, PhaseTimer())
    assert sorted(got.rewards.isnan().tolist()) == [False, True] and got.rewards.nansum() == 1.0
    assert got.metrics["reward/remote_failed"] == 1.0


@pytest.mark.parametrize("algo", ["rloo", "ppo", "trpo"])
def test_every_algorithm_trains_on_split_agent_trajectories(tmp_path, algo):
    trainer = make_agent_run(tmp_path, own_agents.rewriting_agent, prompts_per_step=2, group_size=4, total_steps=1,
                             max_new_tokens=4, algo=algo)
    start = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    trainer.train()
    trainer.close()
    assert any(not torch.equal(v, start[k]) for k, v in trainer.policy.state_dict().items())
    (step,) = [r for r in JsonlLog(tmp_path / "run" / "metrics.jsonl").records() if "agent/split_share" in r]
    assert step["agent/split_share"] == 1.0 and step["reward/std"] > 0
