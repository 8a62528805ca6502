"""verifiers tasksets through the text-environment protocol: a task per reset, weighted rewards, toolsets as
tools, what needs verifiers' harness refused by name, and two training steps of the tiny model."""

from __future__ import annotations

import pytest

pytest.importorskip("verifiers.v1")

from grouprl.envs import Episode, make_env_factory  # noqa: E402
from grouprl.envs.factory import env_tools  # noqa: E402
from grouprl.errors import ConfigError  # noqa: E402
from tests.helpers.agents import make_agent_trainer, train_two_steps  # noqa: E402

TASKS = "verifiers:tests.helpers.verifiers_tasks:TASKS"


def test_a_reset_opens_the_seeds_task_and_the_answer_is_scored_by_weighted_rewards():
    env = make_env_factory(TASKS)()
    assert env.reset(seed=4)[0] == [{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "Write digits, task 1."}]
    # digits: 1 of 2 characters; exact: no
    assert env.step("1a") == ("", 0.5, True, False, {})
    env.reset(seed=4)
    assert env.step("1")[1] == 1.0 + 0.5  # digits 1, exact 1 at weight 0.5
    ep = Episode(make_env_factory(TASKS)(), seed=2)
    ep.start()
    assert ep.respond("22") is None and (ep.return_, ep.end_reason) == (1.0, "env")  # not task 2's exact "2"


def test_toolsets_become_tools_with_their_mcp_schema():
    tools = env_tools(make_env_factory(TASKS))
    assert [t.schema["function"]["name"] for t in tools] == ["count"]
    assert tools[0].schema["function"]["description"] == "Count the characters of a text."
    assert tools[0].schema["function"]["parameters"]["properties"] == {"text": {"title": "Text", "type": "string"}}
    env = make_env_factory(TASKS)()
    ep = Episode(env, tools, seed=0)
    ep.start()
    assert ep.respond('<tool_call>{"name": "count", "arguments": {"text": "abcd"}}</tool_call>') == \
        [{"role": "tool", "name": "count", "content": "4"}]
    wrong = ep.respond('<tool_call>{"name": "count", "arguments": {"text": 5}}</tool_call>')[0]["content"]
    assert wrong.startswith("error: count raised ValidationError") and "Input should be a valid string" in wrong
    assert ep.respond("0") is None and ep.return_ == 1.5


def test_a_function_gets_the_options_and_bad_tasksets_are_named():
    assert make_env_factory("verifiers:tests.helpers.verifiers_tasks:digit_tasks", {"size": 1})().tasks[0].data.idx == 0
    assert len(make_env_factory("verifiers:tests.helpers.verifiers_tasks:digit_tasks", {"size": 2})().tasks) == 2
    with pytest.raises(ConfigError, match="is a Taskset: env_options {'size': 1} go to a function returning one"):
        make_env_factory(TASKS, {"size": 1})
    with pytest.raises(ConfigError, match="gives a DigitData, not a verifiers.v1 Taskset"):
        make_env_factory("verifiers:tests.helpers.verifiers_tasks:DigitData")
    with pytest.raises(ConfigError, match=r"rewards \['passed'\] of SandboxTask read a runtime"):
        make_env_factory("verifiers:tests.helpers.verifiers_tasks:sandboxed")
    with pytest.raises(ConfigError, match="is an infinite taskset: bound it"):
        make_env_factory("verifiers:tests.helpers.verifiers_tasks:ENDLESS")


def test_a_taskset_trains_two_steps(tmp_path):
    trainer = make_agent_trainer(tmp_path, env=TASKS, total_steps=2, group_size=8, max_new_tokens=16)
    records = train_two_steps(trainer)
    # the rewards' sum reached the trainer: some answers held digits, none was a task's exact target
    assert all(0 < r["env/return_mean"] < 1 and r["reward/mean"] == pytest.approx(r["env/return_mean"])
               for r in records)
