"""Group judges: Bradley-Terry ranking, the strict LM answer format, loading, checks, and a judge in a
training step (rewards, dropped groups, agreement, reward/independent)."""

import json
import math
import sys

import pytest
import torch

from grouprl.errors import ConfigError, RewardFunctionError
from grouprl.rewards.judges import (
    JudgeGroup,
    LanguageModelJudge,
    RewardModelJudge,
    common_prefix,
    judge_prompt,
    load_judge,
    mean_win_probability,
    member_labels,
    parse_scores,
    run_judge,
)
from grouprl.trainer.judging import apply_judge, rank_correlation
from grouprl.types import RolloutBatch


def test_mean_win_probability_by_hand():
    # r = (0, ln 3, ln 3): p(1 beats 0) = 3/4, p(1 beats 2) = 1/2 -> member 1: (3/4 + 1/2) / 2 = 5/8;
    # member 0 loses both at 1/4 -> 1/4
    got = mean_win_probability(torch.tensor([0.0, math.log(3), math.log(3)]))
    torch.testing.assert_close(got, torch.tensor([0.25, 0.625, 0.625]))
    assert mean_win_probability(torch.tensor([2.0])).tolist() == [0.5]


def test_lm_answers_parse_strictly_or_drop_the_group():
    assert parse_scores("1: 3\n\n2: 9.5\n3:0", 3) == [0.3, 0.95, 0.0]
    for bad in ("1: 3\n2: 9", "1: 3\n2: 9\n3: 11", "1: 3\n3: 9\n2: 1", "Scores: 1: 3 2: 9 3: 1",
                "1: 3\n2: 9\n3: 1\n4: 2", "1: -1\n2: 9\n3: 1", "1: 3/10\n2: 9\n3: 1"):
        assert parse_scores(bad, 3) is None, bad


def test_the_lm_judge_states_the_task_and_the_shared_prefix_once():
    shared = "I will think about this step by step before answering. "
    group = JudgeGroup(prompt="What is 2+3?", completions=[shared + "The answer is 5.", shared + "It is 6."])
    text = judge_prompt(group)
    assert text.count("What is 2+3?") == 1 and text.count(shared.strip()) == 1
    first, second = member_labels(group)
    assert f'Response {first} (continued):\n"The answer is 5."' in text
    assert text.endswith(f"{first}: <score>\n{second}: <score>")
    assert common_prefix(["abc def", "abc xyz"]) == ""  # too short to be worth stating apart


def test_the_lm_judge_drops_what_does_not_parse_and_scores_what_does(monkeypatch):
    judge = LanguageModelJudge.__new__(LanguageModelJudge)  # the answers are given below: no model needed
    judge.batch_size, judge.max_new_tokens = 2, None
    asked = []

    def answer(questions, max_new_tokens):
        asked.append((len(questions), max_new_tokens))
        def one(q):  # 2 and 8 under the members' labels, read from the prompt's "Response <label>:" lines
            a, b = [line.split()[1].rstrip(":") for line in q.splitlines() if line.startswith("Response ")]
            return f"{a}: 2\n{b}: 8" if "2+3" in q else "both are fine"

        return [one(q) for q in questions]

    judge.answer = answer
    groups = [JudgeGroup("What is 2+3?", ["5", "6"]), JudgeGroup("Name a colour", ["red", "blue"]),
              JudgeGroup("What is 2+3 again?", ["4", "5"])]
    assert run_judge(judge, groups) == [[0.2, 0.8], None, [0.2, 0.8]]
    assert asked == [(2, 24), (1, 24)]  # groups in batches of batch_size, 8 tokens per member + 8


def test_a_real_lm_judge_runs_batched_and_its_unparsable_answers_are_dropped():
    from grouprl.models import tiny_causal_lm

    judge = LanguageModelJudge.__new__(LanguageModelJudge)
    judge.model, judge.tokenizer = tiny_causal_lm(seed=0)
    judge.batch_size, judge.max_new_tokens = 4, 6
    answers = judge.answer(["short", "a much longer question than the first"], 6)
    assert len(answers) == 2 and all(isinstance(a, str) for a in answers)
    assert run_judge(judge, [JudgeGroup("q", ["a", "b"])]) == [None]  # random weights do not write "1: x\n2: y"


def test_reward_model_judge_ranks_the_preferred_member_first(tmp_path):
    from grouprl.rewards import train_reward_model
    from tests.rewards.test_reward_model import synthetic_pairs, tiny_reward_model

    model, tok = tiny_reward_model()
    train_reward_model(model, tok, synthetic_pairs(96, seed=1), epochs=3, batch_size=16, lr=3e-3,
                       output_dir=tmp_path / "rm")
    judge = load_judge(f"reward_model:{tmp_path / 'rm'}", {"batch_size": 4})
    assert isinstance(judge, RewardModelJudge)
    groups = [JudgeGroup(p["prompt"], [p["rejected"], p["chosen"], p["rejected"]]) for p in synthetic_pairs(8, 5)]
    scores = run_judge(judge, groups)
    assert sum(s[1] > max(s[0], s[2]) for s in scores) >= 7  # "yes" beats "no" in (almost) every group
    for s in scores:  # mean win probabilities of a group of 3 sum to 3/2
        assert sum(s) == pytest.approx(1.5) and all(0 < x < 1 for x in s)


def test_user_judges_load_and_bad_answers_name_the_judge(tmp_path, monkeypatch):
    module = tmp_path / "my_judges.py"
    module.write_text("def by_length(prompt, completions, answer=None):\n"
                      "    return [len(c) for c in completions]\n"
                      "def make(bonus):\n"
                      "    return lambda prompt, completions, **_: [bonus] * len(completions)\n"
                      "def as_dict(prompt, completions, **_):\n"
                      "    return {c: 1 for c in completions}\n"
                      "def short(prompt, completions, **_):\n"
                      "    return [1.0]\n"
                      "def nan(prompt, completions, **_):\n"
                      "    return [float('nan')] * len(completions)\n"
                      "def exits(prompt, completions, **_):\n"
                      "    raise SystemExit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    groups = [JudgeGroup("p", ["a", "bbb"], {"answer": "3"})]
    assert run_judge(load_judge("my_judges:by_length"), groups) == [[1.0, 3.0]]
    assert run_judge(load_judge("my_judges:make", {"bonus": 2}), groups) == [[2.0, 2.0]]
    for name, message in (("as_dict", "returned a dict"), ("short", r"returned \[1.0\]; a judge returns 2 finite"),
                          ("nan", "2 finite numbers"), ("exits", "raised SystemExit: 3")):
        with pytest.raises(RewardFunctionError, match=f"judge {name}.*{message}"):
            run_judge(load_judge(f"my_judges:{name}"), groups)
    with pytest.raises(ConfigError, match="my_judges:missing"):
        load_judge("my_judges:missing")
    sys.modules.pop("my_judges", None)


def test_rank_correlation_by_hand():
    # ranks (1, 2, 3) against (3, 2, 1): rho = -1; against ties (1.5, 1.5, 3): cov 1.5 / sqrt(2 * 1.5)
    assert rank_correlation(torch.tensor([1., 2., 3.]), torch.tensor([9., 5., 1.])) == pytest.approx(-1.0)
    assert rank_correlation(torch.tensor([1., 2., 3.]), torch.tensor([0., 0., 1.])) == pytest.approx(3 ** 0.5 / 2)
    assert math.isnan(rank_correlation(torch.tensor([1., 2.]), torch.tensor([4., 4.])))


def batch_of(completions, group_size):
    b = len(completions)
    return RolloutBatch(prompt_ids=torch.zeros(b, 1, dtype=torch.long), prompt_mask=torch.ones(b, 1),
                        completion_ids=torch.zeros(b, 1, dtype=torch.long), completion_mask=torch.ones(b, 1),
                        sampling_logprobs=torch.zeros(b, 1), truncated=torch.zeros(b, dtype=torch.bool),
                        group_size=group_size,
                        prompts=[f"q{i // group_size}" for i in range(b)], completions=completions)


def test_apply_judge_makes_the_reward_keeps_the_independent_one_and_drops_unparsed_groups():
    def judge(prompt, completions, answer):
        return None if prompt == "q1" else [len(c) + (answer == c) for c in completions]

    batch = batch_of(["7", "77", "777", "x", "y", "z"], 3)
    independent = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0])
    columns = {"answer": ["7"] * 3 + ["x"] * 3}
    total, per_fn, m = apply_judge(judge, None, batch, independent, {"exact": independent}, columns)
    # group 0: lengths 1, 2, 3, +1 for the exact answer "7" -> 2, 2, 3; group 1 dropped -> NaN rows
    assert total[:3].tolist() == [2.0, 2.0, 3.0] and torch.isnan(total[3:]).all()
    assert m["judge/dropped_groups"] == 1.0 and m["judge/score_mean"] == pytest.approx(7 / 3)
    # ranks of (2, 2, 3) = (1.5, 1.5, 3) against (1, 0, 0) = (3, 1.5, 1.5): cov -0.75 / 1.5 = -0.5
    assert m["judge/agreement"] == pytest.approx(-0.5)
    assert set(per_fn) == {"exact", "judge", "independent"} and torch.equal(per_fn["independent"], independent)
    weighted, _, _ = apply_judge(judge, 0.5, batch, independent, {}, columns)
    assert weighted[:3].tolist() == [2.0, 1.0, 1.5] and torch.isnan(weighted[3:]).all()  # 1 + 0.5 * 2, ...


def test_a_judge_trains_through_the_cli_and_its_metrics_are_logged(tmp_path, capsys):
    from grouprl.cli import main
    from tests.cli.test_cli import tiny_run_args

    module = tmp_path / "judge_module.py"
    module.write_text("def longest(prompt, completions, **_):\n"
                      "    return [float(len(c)) for c in completions]\n")
    code = main(["train", *tiny_run_args(tmp_path, "--judge", f"{module}:longest")])
    assert code == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in records if "reward/judge" in r]
    assert len(trained) == 2
    for r in trained:
        assert r["judge/dropped_groups"] == 0.0 and "reward/independent" in r
        assert r["reward/mean"] == pytest.approx(r["reward/judge"])  # the judge alone is the reward
    # a judge LM whose answers never parse (random weights): every group dropped, nothing learnt from them
    code = main(["train", *tiny_run_args(tmp_path, "--judge", "lm:tiny", "--judge_options", '{"max_new_tokens": 4}',
                                         "--overwrite")])
    assert code == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in records if "judge/dropped_groups" in r]
    assert [r["judge/dropped_groups"] for r in trained] == [2.0, 2.0]  # both groups of both steps
    assert all(r.get("optim/skipped", 0) > 0 and "policy/kl" not in r for r in trained)  # no group, no update
    code = main(["train", *tiny_run_args(tmp_path, "--judge", "reward_model:/nowhere", "--overwrite")])
    assert code == 2 and "not a folder saved by grouprl train-rm" in capsys.readouterr().err
