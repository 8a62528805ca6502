"""Hub datasets as users name them: a folder in the hub's layout with configs and splits, read through
``datasets``; the answer column; the run config's dataset keys; an unreachable hub in one message."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from grouprl.cli.build import answer_checker, build_inputs
from grouprl.config import TrainConfig, check
from grouprl.data import DataError, load_prompts
from tests.helpers.hub_layout import gold, problem, write_gsm8k_layout


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory):
    return write_gsm8k_layout(tmp_path_factory.mktemp("hub") / "gsm8k")


def test_a_folder_in_the_hub_layout_gives_each_config_and_split(gsm8k):
    train = load_prompts(gsm8k, "question", split="train", config="main")
    assert [r["prompt"] for r in train] == [problem(i)["question"] for i in range(12)]
    assert train[0]["answer"].endswith("#### 13") and set(train[0]) == {"prompt", "answer"}
    test = load_prompts(gsm8k, "question", split="test", config="main")
    assert [r["answer"] for r in test] == [problem(i)["answer"] for i in range(12, 16)]
    assert len(load_prompts(gsm8k, "question", config="socratic")) == 2  # no split: train


@pytest.mark.parametrize("config, split, message", [
    ("mian", "train", "dataset_config 'mian'"),
    ("main", "validation", "split 'validation'"),
    (None, "train", "Config name is missing"),  # two configs: one must be named
])
def test_a_config_or_split_the_folder_lacks_is_named(gsm8k, config, split, message):
    with pytest.raises(DataError, match=re.escape(message)) as caught:
        load_prompts(gsm8k, "question", split=split, config=config)
    assert str(gsm8k) in str(caught.value)


def test_the_answer_column_is_renamed_to_answer(tmp_path):
    rows = [{"problem": "What is 1/2 + 1/2?", "solution": r"It is $\boxed{1}$.", "level": "Level 1"}]
    path = tmp_path / "math.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = load_prompts(path, "problem", answer_column="solution")
    assert loaded == [{"level": "Level 1", "answer": r"It is $\boxed{1}$.", "prompt": "What is 1/2 + 1/2?"}]
    with pytest.raises(DataError, match=r"no column 'gold' \(answer_column\); columns: 'problem', 'solution'"):
        load_prompts(path, "problem", answer_column="gold")
    path.write_text(json.dumps({**rows[0], "answer": "1"}) + "\n")
    with pytest.raises(DataError, match="both 'solution' .the answer column. and 'answer'"):
        load_prompts(path, "problem", answer_column="solution")


def test_an_unreachable_hub_says_how_to_fetch_the_dataset(monkeypatch):
    import datasets.config
    import huggingface_hub.constants

    # both libraries read HF_HUB_OFFLINE once, at import: set it where they keep it, as a fresh process would
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError) as caught:
        load_prompts("made-up-owner/no-such-gsm8k", "question", split="train", config="main")
    message = str(caught.value)
    assert message.startswith("dataset 'made-up-owner/no-such-gsm8k' (dataset_config 'main') is not in the local "
                              "cache and the Hugging Face hub cannot be reached from here")
    assert "`hf download made-up-owner/no-such-gsm8k --repo-type dataset --local-dir data/no-such-gsm8k`" in message
    assert "load_dataset('made-up-owner/no-such-gsm8k', 'main').save_to_disk(" in message
    assert "Traceback" not in message and "\n" not in message


def config_of(gsm8k, **kwargs) -> TrainConfig:
    return TrainConfig(**{"dataset": str(gsm8k), "dataset_config": "main", "dataset_split": "train",
                          "eval_split": "test", "prompt_column": "question", "reward_functions": ("math_equivalence",),
                          **kwargs})


def test_eval_split_holds_out_the_same_folder_and_the_checker_reads_gsm8k_golds(gsm8k):
    inputs = build_inputs(config_of(gsm8k))
    assert [r["prompt"] for r in inputs.train_rows] == [problem(i)["question"] for i in range(12)]
    assert [r["prompt"] for r in inputs.eval_rows] == [problem(i)["question"] for i in range(12, 16)]
    assert inputs.is_correct is answer_checker
    row = inputs.eval_rows[0]  # problem 12: 15 + 34 apples, gold '... #### 49'
    assert row["answer"].endswith("\n#### 49") and gold(12) == 49
    assert inputs.is_correct("15 + 34 = 49 apples.\n#### 49", row)
    assert inputs.is_correct(r"So he has $\boxed{49}$ apples.", row)
    assert not inputs.is_correct("#### 48", row)
    assert not inputs.is_correct("He has many apples.", row)
    # eval_size takes the first rows of the held-out split; 0 evaluates nothing
    assert len(build_inputs(config_of(gsm8k, eval_size=2)).eval_rows) == 2
    assert build_inputs(config_of(gsm8k, eval_size=0)).eval_rows == []


@pytest.mark.parametrize("kwargs, message", [
    (dict(eval_split="train"), "eval_split='train' is the split trained on (dataset_split)"),
    (dict(dataset_split=None, eval_split="train"), "eval_split='train' is the split trained on"),
    (dict(answer_column="question"), "prompt_column and answer_column are both 'question'"),
])
def test_dataset_keys_that_cannot_work_are_refused_before_loading(gsm8k, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        check(config_of(gsm8k, **kwargs))


def test_dataset_keys_need_a_dataset_and_files_have_no_configs_or_splits(tmp_path):
    for key, value in (("dataset_config", "main"), ("eval_split", "test"), ("answer_column", "solution")):
        with pytest.raises(ValueError, match=f"{key} apply to a dataset, but no dataset is set"):
            check(TrainConfig(**{key: value}))
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "1+1?", "answer": 2}) + "\n")
    base = {"dataset": str(path), "reward_functions": ("exact_match",)}
    with pytest.raises(ValueError, match="dataset_config='main' names a config of a hub dataset, but .* is a file"):
        check(TrainConfig(**base, dataset_config="main"))
    with pytest.raises(ValueError, match="eval_split='test' picks a split of a dataset folder or hub id, but"):
        check(TrainConfig(**base, eval_split="test"))


def test_system_prompt_comes_before_each_dataset_prompt_in_the_chat_template(gsm8k):
    from grouprl.models import tiny_tokenizer
    from grouprl.rollout.prompts import encode_checked

    tokenizer = tiny_tokenizer()
    rows = load_prompts(gsm8k, "question", split="test", config="main")
    rows.append({"prompt": [{"role": "system", "content": "Its own."}, {"role": "user", "content": "2+2?"}]})
    ids = encode_checked(tokenizer, rows, "eval", 512, system_prompt="End with '#### N'.", use_chat_template=True)
    texts = [tokenizer.decode(row_ids) for row_ids in ids]
    first = texts[0]
    assert first.index("End with '#### N'.") < first.index(problem(12)["question"])
    assert "#### 49" not in first  # the gold answer stays out of the prompt
    assert "Its own." in texts[-1] and "End with" not in texts[-1]  # a prompt's own system message wins


def test_a_saved_dataset_dict_gives_its_splits_and_has_no_configs(tmp_path):
    import datasets

    folder = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list([problem(i) for i in range(5)]),
                          "test": datasets.Dataset.from_list([problem(i) for i in range(5, 8)])}).save_to_disk(folder)
    config = TrainConfig(dataset=str(folder), eval_split="test", prompt_column="question",
                         reward_functions=("math_equivalence",))
    inputs = build_inputs(config)
    assert (len(inputs.train_rows), len(inputs.eval_rows)) == (5, 3)
    assert inputs.eval_rows[0]["prompt"] == problem(5)["question"]
    with pytest.raises(ValueError, match="written by save_to_disk, which holds one config already"):
        check(TrainConfig(dataset=str(folder), dataset_config="main", prompt_column="question",
                          reward_functions=("math_equivalence",)))


def test_golds_that_give_no_answer_are_counted_before_training(tmp_path):
    path = tmp_path / "golds.jsonl"
    answers = ["#### 4", "#### 6", "", r"It is $\boxed{8}$."]
    path.write_text("".join(json.dumps({"prompt": f"Q{i}?", "answer": a}) + "\n" for i, a in enumerate(answers)))
    config = TrainConfig(dataset=str(path), eval_size=0, reward_functions=("math_equivalence",))
    with pytest.warns(UserWarning, match=re.escape("1 of 4 gold answers in answer_column 'answer' of ") +
                      r".*give no answer to compare with \(e\.g\. at golds\.jsonl line 3: ''\)"):
        build_inputs(config)
    path.write_text("".join(json.dumps({"prompt": f"Q{i}?", "answer": ""}) + "\n" for i in range(3)))
    with pytest.raises(DataError, match="3 of 3 gold answers .* none does, so no completion could ever be scored"):
        build_inputs(config)
    # not compared as answers (no math reward, a checker of the user's own): not checked
    own = TrainConfig(dataset=str(path), eval_size=0, reward_functions=("format",),
                      accuracy_fn="grouprl.cli.demo:only_digits")
    assert len(build_inputs(own).train_rows) == 3


def test_a_reward_function_asking_for_the_renamed_column_is_told_its_new_name(tmp_path):
    from grouprl.errors import ConfigError
    from tests.helpers.hub_layout import write_math_layout

    rewards = tmp_path / "rewards.py"
    rewards.write_text("def by_solution(prompts, completions, solution):\n    return [0.0] * len(completions)\n")
    config = TrainConfig(dataset=str(write_math_layout(tmp_path / "math")), dataset_config="algebra",
                         eval_split="test", prompt_column="problem", answer_column="solution",
                         reward_functions=(f"{rewards}:by_solution",))
    with pytest.raises(ConfigError, match="takes 'solution', the column that answer_column renames to 'answer'"):
        build_inputs(config)
    inputs = build_inputs(replace(config, reward_functions=("math_equivalence",)))
    assert inputs.eval_rows[0]["answer"] == r"Adding 7 to both sides gives $x = \boxed{14}$."
    assert inputs.is_correct(r"So $x = \boxed{14}$.", inputs.eval_rows[0])
