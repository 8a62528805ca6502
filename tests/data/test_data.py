"""Prompt datasets: file formats, the prompt column, splits and the clear errors."""

import csv
import json
import re

import pytest

from grouprl.data import (
    DataError,
    PromptTooLongError,
    check_prompt_lengths,
    load_prompts,
    load_records,
    row_places,
    train_eval_split,
)

ROWS = [
    {"question": "What is 2+2?", "answer": 4, "source": "a"},
    {"question": "What is 3+3?", "answer": 6, "source": "b"},
]
CHAT = [{"role": "user", "content": "Hi"}]


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_jsonl_renames_the_prompt_column_and_keeps_the_others(tmp_path):
    rows = load_prompts(write_jsonl(tmp_path / "d.jsonl", ROWS), prompt_column="question")
    assert rows == [{"answer": 4, "source": "a", "prompt": "What is 2+2?"},
                    {"answer": 6, "source": "b", "prompt": "What is 3+3?"}]


def test_csv_parquet_json_and_datasets_give_the_same_rows(tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(tmp_path / "d.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["question", "answer", "source"])
        writer.writeheader()
        writer.writerows(ROWS)
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "d.parquet")
    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "folder"))
    dataset_dict = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)})

    expected = load_prompts(write_jsonl(tmp_path / "d.jsonl", ROWS), prompt_column="question")
    as_csv = load_prompts(tmp_path / "d.csv", prompt_column="question")
    assert [r["prompt"] for r in as_csv] == [r["prompt"] for r in expected]
    assert as_csv[0]["answer"] == "4"  # CSV has no types; answer checkers compare numbers by value
    for source in (tmp_path / "d.parquet", str(tmp_path / "d.json"), tmp_path / "folder", dataset_dict,
                   datasets.Dataset.from_list(ROWS)):
        assert load_prompts(source, prompt_column="question") == expected, source


def test_chat_messages_and_system_prompt(tmp_path):
    rows = [{"prompt": CHAT, "answer": 1}, {"prompt": "plain", "answer": 2}]
    loaded = load_prompts(write_jsonl(tmp_path / "chat.jsonl", rows))
    assert loaded[0]["prompt"] == CHAT and loaded[1]["prompt"] == "plain"

    with_system = load_prompts(rows, system_prompt="Be brief.")
    assert with_system[1]["prompt"] == [{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "plain"}]

    with open(tmp_path / "chat.csv", "w", newline="") as f:  # CSV stores messages as JSON text
        csv.writer(f).writerows([["prompt"], [json.dumps(CHAT)]])
    assert load_prompts(tmp_path / "chat.csv")[0]["prompt"] == CHAT


def test_missing_column_names_the_columns_that_exist(tmp_path):
    with pytest.raises(DataError, match=r"no column 'prompt'; columns: 'question', 'answer', 'source'"):
        load_prompts(write_jsonl(tmp_path / "d.jsonl", ROWS))


@pytest.mark.parametrize(("rows", "message"), [
    ([], "has no rows"),
    ([{"prompt": "ok"}, {"prompt": "   "}], "row 1: the prompt must be non-empty text"),
    ([{"prompt": 42}], "row 0: the prompt must be"),
    ([{"prompt": [{"role": "user"}]}], "row 0: every chat message needs string 'role' and 'content'"),
    ([{"question": "q", "prompt": "p"}], "has both 'question'"),
])
def test_bad_rows(rows, message):
    with pytest.raises(DataError, match=message):
        load_prompts(rows, prompt_column="question" if "both" in message else "prompt")


def test_file_errors(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{"prompt": \n')
    with pytest.raises(DataError, match="line 2 is not valid JSON"):
        load_records(tmp_path / "bad.jsonl")
    with pytest.raises(DataError, match="does not exist"):
        load_records(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="has no rows"):
        load_prompts(tmp_path / "empty.jsonl")
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(ValueError, match="unknown prompt file format '.txt'"):
        load_records(tmp_path / "d.txt")
    (tmp_path / "plain_folder").mkdir()
    with pytest.raises(DataError, match="neither a saved `datasets` dataset"):
        load_records(tmp_path / "plain_folder")


def test_train_eval_split():
    rows = [{"prompt": str(i)} for i in range(20)]
    train, held = train_eval_split(rows, eval_fraction=0.25, seed=1)
    assert len(train) == 15 and len(held) == 5
    assert sorted(int(r["prompt"]) for r in train + held) == list(range(20))
    assert [int(r["prompt"]) for r in train] == sorted(int(r["prompt"]) for r in train)  # order kept
    assert train_eval_split(rows, eval_fraction=0.25, seed=1) == (train, held)
    assert train_eval_split(rows, eval_fraction=0.25, seed=2)[1] != held
    assert len(train_eval_split(rows[:3], eval_fraction=0.01)[1]) == 1  # at least one eval row
    with pytest.raises(ValueError, match="exactly one"):
        train_eval_split(rows, eval_fraction=0.1, eval_size=2)
    with pytest.raises(ValueError, match="leaves no train"):
        train_eval_split(rows, eval_size=20)


def test_prompt_lengths_name_the_row():
    rows = [{"prompt": "short"}, {"prompt": "a very long prompt"}, {"prompt": "also long"}]
    check_prompt_lengths([[1] * 3, [1] * 8, [1] * 9], max_len=9, rows=rows)
    with pytest.raises(PromptTooLongError, match=r"2 prompt\(s\) longer than 5 tokens; first: row 1 with 8 tokens "
                                                 r"\(prompt 'a very long prompt'\)"):
        check_prompt_lengths([[1] * 3, [1] * 8, [1] * 9], max_len=5, rows=rows)


@pytest.mark.parametrize("suffix, body", [
    (".jsonl", b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n'),
    (".json", b'[{"prompt": "ok"},\n {"prompt": "caf\xe9"}]'),
    (".csv", b'prompt\ncaf\xe9\n'),
])
def test_a_file_that_is_not_utf8_is_named_with_its_line(tmp_path, suffix, body):
    from grouprl.data import load_prompts
    from grouprl.errors import DataError

    path = tmp_path / f"prompts{suffix}"
    path.write_bytes(body)
    with pytest.raises(DataError, match=rf"prompts{suffix}, line 2: byte 0xe9 is not UTF-8"):
        load_prompts(path)


def test_row_places_name_the_line_a_user_can_open(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n{"prompt": "c"}\n')  # a blank line between
    assert row_places(jsonl, 3) == ["p.jsonl line 1", "p.jsonl line 3", "p.jsonl line 4"]
    csv_file = tmp_path / "p.csv"
    csv_file.write_text('prompt,answer\n"two\nlines",1\nplain,2\n')  # a quoted field spans lines 2-3
    assert row_places(csv_file, 2) == ["p.csv line 2", "p.csv line 4"]
    assert row_places([{"prompt": "x"}], 1) == ["list row 0"]
    with pytest.raises(DataError, match=r"p.jsonl line 3: row 1: the prompt must be non-empty text"):
        jsonl.write_text('{"prompt": "a"}\n\n{"prompt": ""}\n')
        load_prompts(jsonl)


def test_a_prompt_too_long_for_the_model_is_named_by_its_file_line(tmp_path, capsys):
    from grouprl.cli import main

    data = tmp_path / "p.jsonl"
    rows = [{"prompt": f"question {i}"} for i in range(6)]
    rows[4]["prompt"] = "word " * 600  # the tiny model's context is 512 tokens
    data.write_text("\n".join(json.dumps(r) + ("\n" if i == 1 else "") for i, r in enumerate(rows)) + "\n")
    code = main(["train", "--model", "tiny", "--dataset", str(data), "--reward_functions", "repetition_penalty",
                 "--eval_size", "0", "--total_steps", "1", "--max_prompt_len", "4096", "--no-progress",
                 "--output_dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "train row 4 (p.jsonl line 6)" in err and "the model's context is 512 tokens" in err


def test_a_missing_column_is_reported_with_the_columns_the_data_has():
    from grouprl.errors import RewardFunctionError
    from grouprl.rewards import exact_match
    from grouprl.trainer.inputs import RunInputs

    rows = [{"prompt": "2+2?", "solution": "4"}]
    with pytest.raises(RewardFunctionError) as caught:
        RunInputs(train_rows=rows, reward_fns=[exact_match])
    message = str(caught.value)
    assert "needs column(s) 'answer'" in message and "(columns: solution)" in message, message
    assert "trajectory" not in message  # only an agent's rows carry the conversation

    def needs_trajectory(prompts, completions, trajectory, **_):
        return [0.0] * len(completions)

    RunInputs(train_rows=[{"seed": 0}], reward_fns=[needs_trajectory], env=lambda: None)  # an agent's: provided


def test_missing_file_tells_a_path_from_a_dataset_id(tmp_path):
    from grouprl.data import missing_file

    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n')
    assert missing_file(tmp_path / "p.jsonl") is None and missing_file(str(tmp_path)) is None
    assert missing_file("nope.jsonl") == "prompt file 'nope.jsonl' does not exist"
    assert missing_file("./data") == "prompt file './data' does not exist"
    assert missing_file("openai/gsm8k") is None  # a Hugging Face id: looked up when the data loads


def test_a_prompt_longer_than_the_context_is_said_so_not_given_a_negative_bound():
    from grouprl.data import context_overflow

    # the case that used to read "lower max_trajectory_tokens to at most -166": 2214 tokens in a context of 2048
    alone = context_overflow("train row 3 (p.jsonl line 4)", 2214, 2048, "max_trajectory_tokens", 1024, longest=2214)
    assert alone.startswith("train row 3 (p.jsonl line 4): the prompt alone is 2214 tokens")
    assert "the model's context is 2048 tokens" in alone and "longer context" in alone
    assert "at most" not in alone and not re.search(r"-\d", alone)
    # a prompt that fits: the bound is the room the longest prompt leaves (2048 - 2010 = 38) when that one fits
    fits = context_overflow("train row 0", 2000, 2048, "max_new_tokens", 64, longest=2010)
    assert fits.endswith("lower max_new_tokens to at most 38 (the room the longest prompt here leaves).")
    # ... and its own room (2048 - 2000 = 48) when the longest does not fit at all
    own = context_overflow("train row 0", 2000, 2048, "max_new_tokens", 64, longest=3000)
    assert own.endswith("lower max_new_tokens to at most 48 (the room this prompt leaves).")
