"""Rewards and judges behind HTTP against a scripted stub service: batches and their JSON, retries with backoff,
failures that drop rows instead of stopping the run, answers refused, and the checks before a run starts."""

import asyncio
import math

import pytest
import torch

from grouprl.config import TrainConfig, check
from grouprl.errors import ConfigError, RewardFunctionError
from grouprl.rewards import remote, score_rewards
from grouprl.rewards.judges import JudgeGroup, load_judge
from grouprl.rewards.remote import RemoteJudge, RemoteReward, mark_unscored
from tests.helpers.reward_service import Stub, stub_service


def lengths(body):
    """Score = length of the completion; null for an empty one."""
    return 200, {"scores": [float(len(c)) if c else None for c in body["completions"]]}


PROMPTS = ["p0", "p1", "p2", "p3", "p4"]
COMPLETIONS = ["a", "bb", "", "dddd", "eeeee"]


def test_rows_go_in_batches_with_their_json_columns_and_scores_come_back_in_order():
    stub = Stub([lengths])
    with stub_service(stub) as url:
        reward = RemoteReward(url, batch_size=2)
        scores = score_rewards([reward], None, PROMPTS, COMPLETIONS, [[1], [2], [3], [4], [5]],
                               columns={"answer": [1, 2, 3, 4, 5], "handle": [object()] * 5})
    got = scores.per_fn[reward.name].tolist()
    assert got[:2] == [1.0, 2.0] and math.isnan(got[2]) and got[3:] == [4.0, 5.0]
    assert reward.name == url.removeprefix("http://") and reward.unanswered(COMPLETIONS) == [False] * 5
    # 3 requests of at most 2 rows; token ids and a column that is no JSON stay home
    assert sorted(stub.requests, key=lambda b: b["prompts"]) == [
        {"prompts": ["p0", "p1"], "completions": ["a", "bb"], "columns": {"answer": [1, 2]}},
        {"prompts": ["p2", "p3"], "completions": ["", "dddd"], "columns": {"answer": [3, 4]}},
        {"prompts": ["p4"], "completions": ["eeeee"], "columns": {"answer": [5]}}]


def test_a_flaky_service_is_retried_with_exponential_backoff(monkeypatch):
    waits, real_sleep = [], asyncio.sleep

    async def sleep(seconds):
        waits.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(remote.asyncio, "sleep", sleep)
    stub = Stub([(503, {"detail": "warming up"}), (429, {"detail": "slow down"}), lengths])
    with stub_service(stub) as url:
        scores = score_rewards([RemoteReward(url, retries=2)], None, PROMPTS[:2], COMPLETIONS[:2])
    assert scores.total.tolist() == [1.0, 2.0] and len(stub.requests) == 3
    assert [w for w in waits if w > 0] == [0.5, 1.0]


def test_a_4xx_fails_at_once_with_the_services_message():
    stub = Stub([(400, {"detail": "columns.answer: field required"})])
    with stub_service(stub) as url, pytest.raises(RewardFunctionError, match="HTTP 400.*field required"):
        score_rewards([RemoteReward(url, retries=3)], None, PROMPTS, COMPLETIONS)
    assert len(stub.requests) == 1  # the request's fault: not retried


def test_unanswered_batches_get_no_reward_and_a_warning_naming_the_url():
    def fails_on_p2(body):
        return (503, {"detail": "overloaded"}) if "p2" in body["prompts"] else lengths(body)

    stub = Stub([fails_on_p2])
    with stub_service(stub) as url:
        reward = RemoteReward(url, batch_size=2, retries=1)
        with pytest.warns(RuntimeWarning, match=f"{url}: 2 of the 5 rows got no score.*HTTP 503"):
            scores = score_rewards([reward], None, PROMPTS, COMPLETIONS)
        assert reward.unanswered(COMPLETIONS) == [False, False, True, True, False]
        assert torch.isnan(scores.total).tolist() == [False, False, True, True, False]
        assert len(stub.requests) == 4  # the failing batch twice (one retry)
        slow = Stub([lengths], delay_s=1.0)
    with stub_service(slow) as url:
        reward = RemoteReward(url, timeout=0.2, retries=1)
        with pytest.warns(RuntimeWarning, match=f"{url}: EVERY ONE of the 2 rows.*ReadTimeout.*after 1 retries"):
            scores = score_rewards([reward], None, PROMPTS[:2], COMPLETIONS[:2])
    assert torch.isnan(scores.total).all() and reward.unanswered(COMPLETIONS[:2]) == [True, True]
    assert len(slow.requests) == 2


@pytest.mark.parametrize("answer, message", [
    ({"scores": [1.0]}, r"answered 1 scores for 2 rows \(rows 0-1\)"),
    ({"scores": [1.0, "high"]}, r"answered 'high' for row 1 \(rows 0-1\)"),
    ({"scores": [1.0, True]}, r"answered True for row 1"),
    ({"reward": [1.0, 2.0]}, r'expected JSON \{"scores": \[...\]\}'),
])
def test_wrong_answers_are_refused_naming_the_url_and_the_row(answer, message):
    with stub_service(Stub([(200, answer)])) as url, pytest.raises(RewardFunctionError, match=message) as caught:
        score_rewards([RemoteReward(url)], None, PROMPTS[:2], COMPLETIONS[:2])
    assert url in str(caught.value)


def test_a_judge_behind_a_url_gets_each_group_and_drops_what_it_cannot_score():
    groups = [JudgeGroup("p0", ["a", "bb"], {"answer": 3, "handle": object()}), JudgeGroup("p1", ["ccc", "d"], {}),
              JudgeGroup("p2", ["e", "ff"], {})]

    def judged(body):
        if body["prompt"] == "p1":
            return 200, {"scores": None}  # the service drops this group itself
        if body["prompt"] == "p2":
            return 500, {"detail": "judge crashed"}
        return 200, {"scores": [float(len(c)) for c in body["completions"]]}

    stub = Stub([judged])
    with stub_service(stub) as url:
        judge = load_judge(url.replace("/score", "/judge"), {"retries": 0})
        assert isinstance(judge, RemoteJudge)
        with pytest.warns(RuntimeWarning, match="1 of the 3 groups got no score.*HTTP 500"):
            assert judge.judge_groups(groups) == [[1.0, 2.0], None, None]
        assert judge.failed_groups == [2]  # the crashed group; the dropped one was answered
        assert {"prompt": "p0", "completions": ["a", "bb"], "columns": {"answer": 3}} in stub.requests
    short = Stub([(200, {"scores": [1.0]})])
    with stub_service(short) as url, pytest.raises(RewardFunctionError, match=r"1 scores for 2 rows \(group 0\)"):
        RemoteJudge(url).judge_groups(groups[:1])


def test_unscored_rows_lose_their_total_and_are_counted():
    def fails_on_p1_and_p3(body):
        return (503, {}) if body["prompts"][0] in ("p1", "p3") else lengths(body)

    def one(prompts, completions):
        return [1.0] * len(completions)

    rows = (PROMPTS[:4], ["a", "bb", "ccc", "dddd"])
    with stub_service(Stub([fails_on_p1_and_p3])) as url, pytest.warns(RuntimeWarning, match="2 of the 4 rows"):
        reward = RemoteReward(url, batch_size=1, retries=0)
        scores = score_rewards([reward, one], None, *rows)
        assert scores.total.tolist() == [2.0, 1.0, 4.0, 1.0]  # the local reward alone where the service failed
        with pytest.warns(RuntimeWarning, match="1 of the 2 rows"):  # a second call (say, evaluation) between
            other = score_rewards([reward], None, PROMPTS[:2], ["x", "yy"])
    got, metrics = mark_unscored([reward, one], None, None, scores.total, rows[1])
    assert torch.isnan(got).tolist() == [False, True, False, True] and got[[0, 2]].tolist() == [2.0, 4.0]
    assert metrics == {"reward/remote_failed": 2.0}
    assert other.total[0] == 1.0 and torch.isnan(other.total[1])
    judge = RemoteJudge(url.replace("/score", "/judge"))
    judge.failed_groups = [1]  # as a judge_groups call that lost the second of two groups leaves it
    groups = torch.tensor([0, 0, 1, 1])
    assert mark_unscored([one], judge, None, got, rows[1], groups)[1] == {"reward/remote_failed": 2.0}
    with stub_service(Stub([(503, {})])) as url, pytest.warns(RuntimeWarning, match="EVERY ONE of the 4 rows"):
        reward = RemoteReward(url, retries=0)
        scores = score_rewards([reward, one], None, *rows)
    # the judge alone makes the reward; a row lost to both services is counted once
    got, metrics = mark_unscored([reward], judge, None, scores.total, rows[1], groups)
    assert got.tolist() == [1.0] * 4 and metrics == {"reward/remote_failed": 4.0}
    assert mark_unscored([one], None, None, got, rows[1]) == (got, {})


@pytest.mark.parametrize("keys, message", [
    ({"reward_functions": ("http://:80/score",)}, "reward_functions: 'http://:80/score' names no host"),
    ({"reward_functions": ("http://h:99999/score",)}, "is not a URL: Port out of range"),
    ({"judge": "https://a b/judge"}, "judge: 'https://a b/judge' is not an http:// or https:// URL"),
    ({"reward_functions": ("http://h:8000/score",), "remote_reward_batch_size": 0},
     "remote_reward_batch_size=0 must be >= 1"),
    ({"judge": "http://h:8000/judge", "remote_reward_timeout": 0.0}, "remote_reward_timeout=0.0 must be a positive"),
    ({"reward_functions": ("http://h:8000/score",), "remote_reward_retries": -1}, "remote_reward_retries=-1"),
    ({"reward_functions": ("http://h:8000/score",), "reward_options": {"http://h:8000/score": {"a": 1}}},
     "a reward service takes no options"),
])
def test_bad_services_and_settings_are_refused_before_anything_loads(keys, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check(TrainConfig(model="tiny", **keys))
    check(TrainConfig(model="tiny", reward_functions=("http://h:8000/score", "exact_match"), judge="https://h/judge"))
    with pytest.raises(ConfigError, match="'ftp://h/score' is not an http"):
        RemoteReward("ftp://h/score")


def test_an_agent_run_counts_the_rows_a_service_left_unscored(tmp_path):
    from tests.helpers.agents import make_agent_trainer

    stub = Stub([(503, {"detail": "down for a moment"}), lengths])  # the first request of the run fails
    with stub_service(stub) as url, pytest.warns(RuntimeWarning, match="4 of the 8 rows got no score"):
        trainer = make_agent_trainer(tmp_path, reward_fns=[RemoteReward(url, batch_size=4, retries=0)],
                                     prompts_per_step=2, group_size=4)
        trainer.train()
    records = [r for r in trainer.metrics_log.records() if "env/return_mean" in r]
    assert [r["reward/remote_failed"] for r in records] == [4.0, 0.0]
    assert len(stub.requests) == 4 and all(isinstance(c, str) for b in stub.requests for c in b["completions"])


def test_services_are_tried_on_a_training_row_before_the_model_loads():
    from grouprl.cli.build import build_inputs

    def config(**keys):
        return TrainConfig(model="tiny", train_size=4, eval_size=0, **keys)

    short = Stub([(200, {"scores": [1.0, 2.0]})])
    with stub_service(short) as url, pytest.raises(RewardFunctionError, match=r"answered 2 scores for 1 rows"):
        build_inputs(config(reward_functions=(url,)))
    [sent] = short.requests
    assert sent["completions"] == [""] and sent["prompts"][0].startswith("What is") and "answer" in sent["columns"]
    refused = Stub([(401, {"detail": "missing or wrong bearer token"})])
    with stub_service(refused) as url, pytest.raises(RewardFunctionError, match="HTTP 401.*wrong bearer token"):
        build_inputs(config(reward_functions=("exact_match",), judge=url.replace("/score", "/judge")))
    assert [len(r["completions"]) for r in refused.requests] == [2]  # the judge is sent a group
    with stub_service(Stub([(200, {"scores": None})])) as url:  # a judge may drop any group, this one too
        assert isinstance(build_inputs(config(reward_functions=("exact_match",), judge=url)).judge, RemoteJudge)
    with stub_service(Stub([(503, {})])) as url, pytest.warns(RuntimeWarning, match="does not answer at the start"):
        inputs = build_inputs(config(reward_functions=(url,), remote_reward_retries=0))
    assert isinstance(inputs.reward_fns[0], RemoteReward)  # not up yet: each step tries again


def test_credentials_in_a_url_stay_out_of_messages_and_metric_names():
    with stub_service(Stub([(400, {"detail": "no"})])) as url:
        secret = url.replace("http://", "http://user:pw@") + "?key=k3y"
        reward = RemoteReward(secret)
        with pytest.raises(RewardFunctionError, match="HTTP 400") as caught:
            score_rewards([reward], None, PROMPTS[:1], COMPLETIONS[:1])
    assert f"'{url}'" in str(caught.value) and "pw" not in str(caught.value) and "k3y" not in str(caught.value)
    assert reward.name == url.removeprefix("http://")
