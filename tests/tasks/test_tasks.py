"""Built-in tasks: seeded prompt generation, answer checking, rewards, the safe expression evaluator."""

from fractions import Fraction

import pytest

from grouprl.registry import UnknownNameError
from grouprl.rewards import score_rewards
from grouprl.tasks import TASKS, ExpressionError, evaluate_expression, get_task
from grouprl.tasks.countdown import check_solution


def columns_of(rows):
    return {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}


def test_registry_and_options():
    assert TASKS.names() == ["arithmetic", "countdown"]
    with pytest.raises(UnknownNameError, match="did you mean 'arithmetic'"):
        get_task("arithmetc")
    with pytest.raises(TypeError, match="unknown option.*'digit'.*valid options: digits, operations"):
        get_task("arithmetic", digit=2)
    with pytest.raises(ValueError, match="operations must be"):
        get_task("arithmetic", operations="+^")


def test_arithmetic_rows_are_seeded_per_split():
    task = get_task("arithmetic")
    assert task.rows("train", 20, seed=0) == task.rows("train", 20, seed=0)
    assert task.rows("train", 20, seed=0) != task.rows("train", 20, seed=1)
    assert task.rows("train", 20, seed=0) != task.rows("eval", 20, seed=0)
    with pytest.raises(ValueError, match="valid splits: train, eval"):
        task.rows("test", 3, seed=0)


def test_arithmetic_default_problems():
    task = get_task("arithmetic")
    for row in task.rows("train", 200, seed=3):
        a, op, b = row["expression"].split()
        a, b = int(a), int(b)
        assert 0 <= a <= 9 and 0 <= b <= 9 and op in "+-"
        assert row["answer"] == (a + b if op == "+" else a - b) >= 0
        assert row["answer"] not in (a, b)  # repeating the question never scores
        assert row["prompt"] == f"What is {a} {op} {b}? Answer with just the number."


def test_arithmetic_difficulty_options():
    task = get_task("arithmetic", digits=2, operations="*", operands=3, allow_negative=True)
    rows = task.rows("eval", 50, seed=0)
    assert all(r["expression"].count("*") == 2 for r in rows)
    assert any(int(n) >= 10 for r in rows for n in r["expression"].split("*"))
    assert all(r["answer"] == eval(r["expression"]) for r in rows)  # noqa: S307 - test oracle on our own output
    mixed = get_task("arithmetic", operations="+-*", operands=3).rows("train", 50, seed=1)
    assert all(r["answer"] == eval(r["expression"]) for r in mixed)  # noqa: S307 - precedence as in Python


@pytest.mark.parametrize(("completion", "correct"), [
    ("2 + 4 = 6", True),
    ("The answer is 6.", True),
    ("6", True),
    ("<answer>6</answer> (I also like 7)", True),
    ("Six is 6, not 7", False),  # the last number counts
    ("The answer is 5.", False),
    ("I don't know", False),
    ("", False),
])
def test_arithmetic_checker_reads_the_final_answer(completion, correct):
    task = get_task("arithmetic")
    assert task.is_correct(completion, {"answer": 6}) is correct


def test_arithmetic_rewards_through_score_rewards():
    task = get_task("arithmetic")
    rows = task.rows("train", 3, seed=0)
    completions = [f"{rows[0]['expression']} = {rows[0]['answer']}", "no idea", str(rows[2]["answer"])]
    scores = score_rewards(task.reward_fns, task.reward_weights, [r["prompt"] for r in rows], completions,
                           columns=columns_of(rows))
    assert scores.total.tolist() == [1.0, 0.0, 1.0]
    assert [task.is_correct(c, r) for c, r in zip(completions, rows)] == [True, False, True]


def test_countdown_problems_are_solvable_and_checked():
    task = get_task("countdown", count=4)
    rows = task.rows("train", 200, seed=0)
    for row in rows:
        assert len(row["numbers"]) == 4 and all(1 <= n <= 20 for n in row["numbers"])
        assert 1 <= row["answer"] <= 100 and row["answer"] not in row["numbers"]
        assert task.is_correct(f"<answer>{row['solution']}</answer>", row), row
        assert str(row["answer"]) in row["prompt"] and "<answer>" in row["prompt"]
    assert task.rows("train", 5, seed=0) == rows[:5]


@pytest.mark.parametrize(("completion", "numbers", "target", "ok"), [
    ("<answer>(25 - 5) * 3</answer>", [3, 5, 25], 60, True),
    ("<answer>(25 - 5) × 3 = 60</answer>", [3, 5, 25], 60, True),
    ("So 5 * (25 - 13) = 60.", [5, 13, 25], 60, True),
    ("<answer>25 + 25 + 5 + 5</answer>", [3, 5, 25], 60, False),  # 25 and 5 used twice
    ("<answer>5 + 5 + 10</answer>", [5, 5, 10], 20, True),  # a number given twice may be used twice
    ("<answer>(3 + 5) * 25</answer>", [3, 5, 25], 60, False),  # wrong value
    ("<answer>60</answer>", [3, 5, 25], 60, False),  # 60 is not a given number
    ("<answer>12 / 5 * 25</answer>", [12, 5, 25], 60, True),  # exact fractions: 12/5*25 = 60
    ("<answer>__import__('os').system('true')</answer>", [3, 5, 25], 60, False),
    ("", [3, 5, 25], 60, False),
])
def test_countdown_checker(completion, numbers, target, ok):
    assert check_solution(completion, numbers, target) is ok


def test_countdown_rewards_include_a_weighted_format_term():
    task = get_task("countdown", format_weight=0.25)
    row = {"prompt": "p", "answer": 60, "numbers": [3, 5, 25], "solution": "(25 - 5) * 3"}
    completions = ["<answer>(25 - 5) * 3</answer>", "<answer>3 + 5</answer>", "(25 - 5) * 3"]
    scores = score_rewards(task.reward_fns, task.reward_weights, ["p"] * 3, completions,
                           columns={k: [v] * 3 for k, v in row.items() if k != "prompt"})
    # correct + tag: 1 + 0.25; tag only: 0.25; correct without a tag (last line is read): 1
    assert scores.total.tolist() == [1.25, 0.25, 1.0]


@pytest.mark.parametrize("text", [
    "2 ** 10", "2.5 + 1", "x + 1", "abs(-3)", "(1).__class__", "[1, 2]", "1 if 1 else 2", "-3 + 5", "1 / 0",
    "True + 1", "(" * 100 + "1" + ")" * 100, "1 +",
])
def test_evaluator_rejects_everything_but_integer_arithmetic(text):
    with pytest.raises(ExpressionError):
        evaluate_expression(text)


def test_evaluator_values():
    assert evaluate_expression("7 / 2") == (Fraction(7, 2), [7, 2])
    assert evaluate_expression("(1 + 2) * (3 - 4) / 6") == (Fraction(-1, 2), [1, 2, 3, 4, 6])
    assert evaluate_expression("-3 + 5", allow_unary_minus=True) == (Fraction(2), [3, 5])
