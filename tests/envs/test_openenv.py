"""OpenEnv environments through the text-environment protocol: in process and from a server by URL, their rewards,
ends and row columns, bad specs named, and two training steps of the tiny model on each."""

from __future__ import annotations

import pytest

pytest.importorskip("openenv.core")

from grouprl.envs import Episode, make_env_factory  # noqa: E402
from grouprl.errors import ConfigError  # noqa: E402
from tests.helpers.agents import make_agent_trainer, train_two_steps  # noqa: E402
from tests.helpers.openenv_envs import serve  # noqa: E402

IN_PROCESS = "openenv:tests.helpers.openenv_envs:DigitTalk"


def play(env, row):
    ep = Episode(env, seed=row["seed"], options=row)
    opening = ep.start()
    replies = [ep.respond("a1"), ep.respond("22")]
    return ep, opening, replies


def test_an_in_process_environment_steps_with_rewards_done_and_row_columns():
    ep, opening, replies = play(make_env_factory(IN_PROCESS)(), {"seed": 7, "level": 3, "other": "x"})
    # the observation's one text field is the user turn; the row's column that reset names reaches it
    assert opening == [{"role": "user", "content": "game 7 level 3: digits"}]
    assert replies == [[{"role": "user", "content": "again 1"}], None]
    assert (ep.step_rewards, ep.return_, ep.success, ep.end_reason) == ([0.5, 1.0], 1.5, True, "env")


def test_options_go_to_the_class_and_name_the_observation_field():
    env = make_env_factory(IN_PROCESS, {"turns": 1, "observation_field": "turn"})()
    assert env.reset(seed=1)[0] == 0
    assert env.step("9")[1:3] == (1.0, True)
    # several text fields and none named: the observation is all of them as JSON
    env = make_env_factory(IN_PROCESS)()
    env.observation_field = None
    assert env._text({"prompt": "a", "echo": "b"}) == '{"prompt": "a", "echo": "b"}'


def test_bad_specs_are_named():
    with pytest.raises(ConfigError, match="is <function make_env_factory.*not an OpenEnv Environment class"):
        make_env_factory("openenv:grouprl.envs:make_env_factory")
    with pytest.raises(ConfigError, match=r"its action has 2 text fields \(code, note.*set env_options.action_field"):
        make_env_factory("openenv:tests.helpers.openenv_envs:TwoTextsEnv")
    with pytest.raises(ConfigError, match="action_field 'cod' is not a field of its action; its fields: code, note"):
        make_env_factory("openenv:tests.helpers.openenv_envs:TwoTextsEnv", {"action_field": "cod"})
    with pytest.raises(ConfigError, match="its action also requires code, which a text reply cannot fill"):
        make_env_factory("openenv:tests.helpers.openenv_envs:TwoTextsEnv", {"action_field": "note"})
    env = make_env_factory("openenv:tests.helpers.openenv_envs:TwoTextsEnv", {"action_field": "code"})()
    env.reset(seed=0)
    assert env.step("12")[1] == 1.0
    with pytest.raises(ConfigError, match="the action schema could not be read from http://127.0.0.1:9/schema"):
        make_env_factory("openenv+http://127.0.0.1:9")


def test_an_in_process_environment_trains_two_steps(tmp_path):
    trainer = make_agent_trainer(tmp_path, env=IN_PROCESS, total_steps=2)
    records = train_two_steps(trainer)
    assert all(0 < r["env/return_mean"] < 2 and r["reward/mean"] == pytest.approx(r["env/return_mean"])
               and r["env/turns_mean"] > 1
               for r in records)


def test_a_server_by_url_plays_and_trains_two_steps(tmp_path):
    with serve() as url:
        ep, opening, replies = play(make_env_factory(f"openenv+{url}")(), {"seed": 4, "level": 2})
        assert opening == [{"role": "user", "content": "game 4 level 2: digits"}]
        assert replies == [[{"role": "user", "content": "again 1"}], None]
        # the server sends no metadata: the success is unknown
        assert (ep.step_rewards, ep.success, ep.end_reason) == ([0.5, 1.0], None, "env")
        trainer = make_agent_trainer(tmp_path, env=f"openenv+{url}", total_steps=2, prompts_per_step=2, group_size=4)
        records = train_two_steps(trainer)
    assert all(0 < r["env/return_mean"] < 2 and r["env/turns_mean"] > 1 for r in records)


def test_a_hub_whose_package_is_missing_names_its_extra(monkeypatch):
    import grouprl.envs.factory as factory

    real = factory.importlib.util.find_spec
    monkeypatch.setattr(factory.importlib.util, "find_spec", lambda name: None if name == "openenv" else real(name))
    with pytest.raises(ConfigError, match=r"needs openenv, which is not installed: pip install 'grouprl\[openenv\]'"):
        make_env_factory("openenv+http://127.0.0.1:9")
