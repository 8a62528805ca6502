"""The example reward service (examples/reward-service/app.py) on loopback, in a process of its own: its scores
are the built-in reward's, its token is checked, it trains from the command line and the Python API, and a run
whose service is killed mid-run finishes with the unscored rows counted."""

import json
import math

import pytest

from grouprl.errors import RewardFunctionError
from grouprl.models import tiny_causal_lm
from grouprl.rewards import math_equivalence, score_rewards
from grouprl.rewards.judges import JudgeGroup
from grouprl.rewards.remote import TOKEN_ENV, RemoteJudge, RemoteReward
from grouprl.trainer.trainer import Trainer
from tests.helpers.reward_service import example_service
from tests.helpers.trainer import base_config

pytestmark = pytest.mark.slow
pytest.importorskip("fastapi", reason="the example service is a FastAPI app")
pytest.importorskip("uvicorn", reason="the example service runs on uvicorn")
TOKEN = "s3cret-for-the-test"
PROMPTS = ["half?", "half again?", "7?", "72?", "no gold", "5?"]
COMPLETIONS = [r"$\boxed{\frac{1}{2}}$", "The answer is 0.5", "#### 7", "<answer>27</answer>", "3", "no idea"]
ANSWERS = ["1/2", r"$\frac{2}{4}$", 7, "48 + 24 = 72\n#### 72", None, 5]


@pytest.fixture(scope="module")
def service():
    with example_service(TOKEN) as started:
        yield started


def metrics_of(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_the_service_scores_as_the_builtin_reward_does(service, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)  # the token comes from the environment
    reward = RemoteReward(f"{service.url}/score", batch_size=4)
    got = score_rewards([reward], None, PROMPTS, COMPLETIONS, columns={"answer": ANSWERS}).per_fn[reward.name]
    want = math_equivalence(PROMPTS, COMPLETIONS, answer=ANSWERS)
    assert want == [1.0, 1.0, 1.0, 0.0, None, 0.0]
    assert [None if math.isnan(x) else x for x in got.tolist()] == want
    judge = RemoteJudge(f"{service.url}/judge")
    groups = [JudgeGroup("72?", ["#### 72", "#### 27", r"\boxed{72}"], {"answer": "#### 72"}),
              JudgeGroup("?", ["1", "2"], {"answer": None})]  # no gold answer: the service drops the group
    assert judge.judge_groups(groups) == [[1.0, 0.0, 1.0], None] and judge.failed_groups == []


def test_a_token_mismatch_is_a_clear_error(service, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    for token in (None, "not-the-token"):
        with pytest.raises(RewardFunctionError, match="HTTP 401.*missing or wrong bearer token"):
            score_rewards([RemoteReward(f"{service.url}/score", token=token)], None, PROMPTS, COMPLETIONS,
                          columns={"answer": ANSWERS})


def test_a_reward_service_and_a_judge_service_train_from_the_command_line(service, tmp_path, capsys, monkeypatch):
    from grouprl.cli import main
    from tests.cli.test_cli import tiny_run_args

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    url = f"{service.url}/score"
    code = main(["train", *tiny_run_args(tmp_path, "--reward_functions", url, "--remote_reward_token", TOKEN,
                                         "--remote_reward_batch_size", "3")])
    assert code == 0, capsys.readouterr().err
    trained = [r for r in metrics_of(tmp_path / "run") if "reward/remote_failed" in r]
    assert [r["reward/remote_failed"] for r in trained] == [0.0, 0.0]
    assert all(r[f"reward/{url.removeprefix('http://')}"] == r["reward/mean"] for r in trained)
    written = (tmp_path / "run" / "config.yaml").read_text()
    assert "remote_reward_batch_size: 3" in written and TOKEN not in written and "remote_reward_token" not in written
    code = main(["train", *tiny_run_args(tmp_path, "--judge", f"{service.url}/judge", "--remote_reward_token", TOKEN,
                                         "--overwrite")])
    assert code == 0, capsys.readouterr().err
    trained = [r for r in metrics_of(tmp_path / "run") if "reward/judge" in r]
    assert len(trained) == 2
    assert all(r["reward/remote_failed"] == 0.0 and r["judge/dropped_groups"] == 0.0 for r in trained)


def test_a_service_killed_mid_run_leaves_the_rows_unscored_and_the_run_finishing(tmp_path):
    rows = [{"prompt": f"What is {i} + 1?", "answer": i + 1} for i in range(8)]
    with example_service(TOKEN) as started:
        calls = []

        def kills_the_service_at_step_2(prompts, completions, **_):
            calls.append(len(completions))
            if len(calls) == 2:
                started.process.kill()
                started.process.wait()
            return [None] * len(completions)  # applies to no row: the service's score is the reward

        remote = RemoteReward(f"{started.url}/score", token=TOKEN, timeout=5, retries=1)
        model, tok = tiny_causal_lm(seed=0)
        trainer = Trainer(base_config(tmp_path), policy=model, tokenizer=tok, train_data=rows,
                          reward_fns=[kills_the_service_at_step_2, remote])
        with pytest.warns(RuntimeWarning, match=f"{started.url}/score: EVERY ONE of the 8 rows.*ConnectError"):
            trainer.train()
    assert calls == [8, 8]
    trained = [r for r in metrics_of(tmp_path / "run") if "reward/remote_failed" in r]
    assert [r["reward/remote_failed"] for r in trained] == [0.0, 8.0]  # P * G rows of step 2
    assert trained[1]["optim/skipped"] > 0 and "policy/kl" not in trained[1]  # no reward, no update
