"""Reward protocol, scoring and combination; the built-in reward functions."""

import asyncio
import functools
import math
import time

import pytest
import torch

from grouprl.registry import UnknownNameError
from grouprl.rewards import (
    RewardFunctionError,
    check_reward_columns,
    combine,
    exact_match,
    extract_answer,
    format_reward,
    length_target,
    make_reward,
    math_equivalence,
    overlong_penalty,
    repetition_penalty,
    reward_name,
    score_rewards,
)
from grouprl.rewards.base import unique_names

PROMPTS = ["p0", "p1", "p2"]
COMPLETIONS = ["a", "bb", "ccc"]
IDS = [[1], [1, 2], [1, 2, 3]]


def fixed(values, name):
    def fn(prompts, completions):
        return list(values)

    fn.__name__ = name
    return fn


def nan_equal(a: torch.Tensor, b: list[float]) -> bool:
    return torch.equal(torch.isnan(a), torch.isnan(torch.tensor(b))) and torch.allclose(
        a.nan_to_num(0.0), torch.tensor(b).nan_to_num(0.0))


def test_total_is_weighted_sum_over_functions_that_applied():
    a = fixed([1.0, None, 0.5, None], "a")
    b = fixed([2.0, 3.0, None, None], "b")
    s = score_rewards([a, b], [1.0, 0.5], ["p"] * 4, ["c"] * 4)
    # row 0: 1*1 + 0.5*2 = 2; row 1: only b applies: 0.5*3 = 1.5; row 2: only a: 0.5; row 3: none -> NaN
    assert nan_equal(s.total, [2.0, 1.5, 0.5, math.nan])
    assert s.total.dtype == torch.float32 and s.total.shape == (4,)
    assert nan_equal(s.per_fn["a"], [1.0, math.nan, 0.5, math.nan])
    assert nan_equal(s.per_fn["b"], [2.0, 3.0, math.nan, math.nan])
    assert s.weights == {"a": 1.0, "b": 0.5}


def test_weights_default_to_one_and_combine_stands_alone():
    s = score_rewards([fixed([1, 2, 3], "x"), fixed([1, 1, 1], "y")], None, PROMPTS, COMPLETIONS)
    assert s.total.tolist() == [2.0, 3.0, 4.0]
    assert combine({"x": torch.tensor([math.nan])}, {"x": 2.0}).isnan().all()


def test_only_accepted_keywords_are_passed_unless_kwargs():
    seen = {}

    def wants_answer(prompts, completions, answer):
        seen["answer"] = answer
        return [0.0] * len(completions)

    def keyword_only(prompts, completions, *, completion_ids, extra="default"):
        seen["ids"], seen["extra"] = completion_ids, extra
        return [0.0] * len(completions)

    def takes_all(prompts, completions, **kwargs):
        seen["all"] = sorted(kwargs)
        return [0.0] * len(completions)

    def takes_nothing(prompts, completions):
        return [1.0] * len(completions)

    columns = {"answer": [1, 2, 3], "other": ["x", "y", "z"]}
    score_rewards([wants_answer, keyword_only, takes_all, takes_nothing], None, PROMPTS, COMPLETIONS, IDS, columns)
    assert seen == {"answer": [1, 2, 3], "ids": IDS, "extra": "default", "all": ["answer", "completion_ids", "other"]}


def test_a_function_that_names_completions_gets_its_inputs_by_name():
    seen = {}

    def reward_len(completions, **kwargs):  # the keyword style: prompts and columns arrive in kwargs
        seen["len"] = (list(completions), sorted(kwargs), kwargs["prompts"])
        return [-abs(2 - len(c)) for c in completions]

    def reversed_order(completions, prompts):
        seen["reversed"] = (list(completions), list(prompts))
        return [0.0] * len(completions)

    def only_completions(completions, answer):
        seen["only"] = (list(completions), answer)
        return [0.0] * len(completions)

    positional = lambda p, c: [float(len(x)) for x in c]  # noqa: E731 - any two names, in this order
    columns = {"answer": [1, 2, 3]}
    s = score_rewards([reward_len, reversed_order, only_completions, positional], None, PROMPTS, COMPLETIONS, IDS,
                      columns)
    assert seen["len"] == (COMPLETIONS, ["answer", "completion_ids", "prompts"], PROMPTS)
    assert seen["reversed"] == (COMPLETIONS, PROMPTS)
    assert seen["only"] == (COMPLETIONS, [1, 2, 3])
    assert s.per_fn["reward_len"].tolist() == [-1.0, 0.0, -1.0] and s.per_fn["<lambda>"].tolist() == [1.0, 2.0, 3.0]


def test_a_function_that_cannot_take_prompts_and_completions_is_refused_before_any_call():
    def one_argument(texts):
        return [0.0] * len(texts)

    def needs_a_third(prompts, outputs, scale):  # positional: scale would be a column, and there is none
        return [0.0] * len(outputs)

    with pytest.raises(RewardFunctionError, match=r"reward function 'one_argument'.*cannot be called as "
                                                  r"fn\(prompts, completions.*too many positional"):
        check_reward_columns([one_argument], ["answer"])
    with pytest.raises(RewardFunctionError, match=r"'needs_a_third'.*needs column\(s\) 'scale'"):
        check_reward_columns([needs_a_third], ["answer"])


def test_async_functions_are_awaited_concurrently():
    async def slow_a(prompts, completions):
        await asyncio.sleep(0.3)
        return [1.0] * len(completions)

    async def slow_b(prompts, completions):
        await asyncio.sleep(0.3)
        return [2.0] * len(completions)

    start = time.perf_counter()
    s = score_rewards([slow_a, slow_b, fixed([0, 0, 0], "sync")], None, PROMPTS, COMPLETIONS)
    assert time.perf_counter() - start < 0.55  # one sleep, not two
    assert s.total.tolist() == [3.0, 3.0, 3.0]

    async def from_a_running_loop():  # e.g. a notebook: a fresh loop runs in a helper thread
        return score_rewards([slow_a], None, PROMPTS, COMPLETIONS)

    assert asyncio.run(from_a_running_loop()).total.tolist() == [1.0, 1.0, 1.0]


def test_raising_function_is_reported_with_name_row_and_completion():
    def fragile(prompts, completions):
        return [1.0 if c != "boom!" else 1 / 0 for c in completions]

    with pytest.raises(RewardFunctionError) as info:
        score_rewards([fixed([0, 0, 0], "fine"), fragile], None, PROMPTS, ["ok", "fine", "boom!"])
    err = info.value
    assert (err.fn_name, err.row, err.completion) == ("fragile", 2, "boom!")
    assert "'fragile'" in str(err) and "row 2" in str(err) and "'boom!'" in str(err) and "ZeroDivisionError" in str(err)


def test_async_raising_function_is_located_too():
    async def bad(prompts, completions):
        if "x" in completions:
            raise KeyError("no key")
        return [0.0] * len(completions)

    with pytest.raises(RewardFunctionError, match=r"'bad' at row 1 \(completion 'x'\): raised KeyError"):
        score_rewards([bad], None, ["p", "p"], ["a", "x"])


@pytest.mark.parametrize(("values", "message"), [
    ([1.0, 2.0], "returned 2 values for 3 completions"),
    ([1.0, float("nan"), 0.0], "row 1 (completion 'bb'): returned nan"),
    ([1.0, 0.0, float("inf")], "row 2 (completion 'ccc'): returned inf"),
    ([1.0, "high", 0.0], "row 1 (completion 'bb'): returned 'high' (str)"),
    (None, "returned NoneType"),
])
def test_bad_return_values_are_errors(values, message):
    with pytest.raises(RewardFunctionError) as info:
        score_rewards([fixed(values, "judge") if values is not None else (lambda p, c: None)], None, PROMPTS,
                      COMPLETIONS)
    assert message in str(info.value)


def test_long_completion_is_quoted_shortened():
    with pytest.raises(RewardFunctionError) as info:
        score_rewards([fixed([float("nan")], "judge")], None, ["p"], ["z" * 5000])
    assert len(str(info.value)) < 500


def test_missing_column_fails_before_calling_anything():
    calls = []

    def needs_answer(prompts, completions, *, answer):
        calls.append(1)
        return [0.0] * len(completions)

    with pytest.raises(RewardFunctionError, match=r"needs column\(s\) 'answer'.*columns: question"):
        check_reward_columns([needs_answer], ["question"])
    with pytest.raises(RewardFunctionError, match="needs column"):
        score_rewards([needs_answer], None, PROMPTS, COMPLETIONS, columns={"question": [1, 2, 3]})
    assert calls == []


def test_list_lengths_must_agree():
    with pytest.raises(ValueError, match="'answer': 2"):
        score_rewards([fixed([0, 0, 0], "f")], None, PROMPTS, COMPLETIONS, columns={"answer": [1, 2]})
    with pytest.raises(ValueError, match="2 reward weights for 1"):
        score_rewards([fixed([0, 0, 0], "f")], [1.0, 2.0], PROMPTS, COMPLETIONS)


def test_reward_names():
    class Judge:
        name = "judge"

        def __call__(self, prompts, completions):
            return [0.0] * len(completions)

    class Unnamed:
        def __call__(self, prompts, completions):
            return [0.0] * len(completions)

    assert reward_name(Judge()) == "judge"
    assert reward_name(Unnamed()) == "Unnamed"
    assert reward_name(functools.partial(exact_match)) == "exact_match"
    assert unique_names([exact_match, exact_match, Judge()]) == ["exact_match", "exact_match_2", "judge"]
    s = score_rewards([length_target(2), length_target(4)], None, PROMPTS, COMPLETIONS, IDS)
    assert list(s.per_fn) == ["length_target", "length_target_2"]


# ---- built-ins -------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("2 + 4 = 6", "6"),
    ("The answer is 1,024.", "1,024"),
    ("10-3=7", "7"),
    ("It drops to -5", "-5"),
    ("<answer>x = 3</answer> and later 9", "x = 3"),
    ("<ANSWER>2</ANSWER><answer>2.0</answer>", "2.0"),
    ("<ANSWER>1</ANSWER><answer>2</answer>", None),
    ("\\boxed{12} and 13", "12"),
    ("nothing here", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_exact_match():
    completions = ["2 + 4 = 6", "The answer is 6.0", "<answer>seven</answer>", "<answer>Seven</answer>", "6,000"]
    answers = [6, "6", 7, "seven", 6000]
    assert exact_match(None, completions, answer=answers) == [1.0, 1.0, 0.0, 1.0, 1.0]


def test_math_equivalence():
    completions = ["so $\\boxed{\\frac{3}{6}}$", "$\\boxed{0.25}$", "$\\boxed{[1, 2)}$", "no idea", "$x=4$"]
    answers = ["\\frac{1}{2}", "1/4", "[1,2)", "3", None]
    assert math_equivalence(None, completions, answer=answers) == [1.0, 1.0, 1.0, 0.0, None]


def test_format_length_overlong_repetition():
    assert format_reward(r"\d+")(None, ["42", " 42\n", "4a2"]) == [1.0, 1.0, 0.0]
    # target 4: 1 - |1-4|/4 = 0.25; 1 - |2-4|/4 = 0.5; 1 - |3-4|/4 = 0.75
    assert length_target(4)(None, COMPLETIONS, completion_ids=IDS) == [0.25, 0.5, 0.75]
    # max 10, cache 4: free up to 6 tokens; 8 tokens -> (6-8)/4 = -0.5; 9 -> -0.75
    pen = overlong_penalty(10, 4)
    assert pen(None, [""] * 4, completion_ids=[[0] * 6, [0] * 8, [0] * 9, [0] * 11]) == [0.0, -0.5, -0.75, -1.0]
    # "the cat the cat" 2-grams: (the cat) (cat the) (the cat): 2 distinct of 3 -> -0.5 * (1/3)
    rep = repetition_penalty(n=2, max_penalty=-0.5)
    assert rep(None, ["the cat the cat", "The the THE the"]) == pytest.approx([-1 / 6, -0.5 * (1 - 1 / 3)])


def test_make_reward_by_name():
    assert make_reward("exact_match") is exact_match
    assert make_reward("accuracy") is make_reward("math_equivalence") is math_equivalence
    assert make_reward("overlong_penalty", max_length=8, cache_length=2)(None, [""], completion_ids=[[0] * 7]) == [-0.5]
    with pytest.raises(UnknownNameError, match="valid names: accuracy, code_execution, exact_match"):
        make_reward("exact")
    with pytest.raises(TypeError, match="bad options"):
        make_reward("length_target", goal=3)
    with pytest.raises(ValueError, match="cache_length"):
        overlong_penalty(4, 8)


def test_a_function_that_edits_its_inputs_changes_nothing_for_the_others():
    def vandal(prompts, completions, answer):
        completions[0] = "hacked"
        answer[0] = "999"
        prompts[0][0]["content"] = "changed"
        completions.append("extra")
        return [1.0, 1.0]

    def honest(prompts, completions, answer):
        return [float(c.strip() == a) + (prompts[i][0]["content"] == "q") for i, (c, a) in
                enumerate(zip(completions, answer))]

    prompts = [[{"role": "user", "content": "q"}], [{"role": "user", "content": "q"}]]
    completions = ["4", "5"]
    scores = score_rewards([vandal, honest], None, prompts, completions, columns={"answer": ["4", "4"]})
    assert scores.per_fn["honest"].tolist() == [2.0, 1.0]
    assert completions == ["4", "5"] and prompts[0][0]["content"] == "q"


@pytest.mark.parametrize("returned", [{"a": 1.0, "b": 0.0}, "10", {1.0, 0.0}])
def test_only_sequences_of_numbers_are_rewards(returned):
    with pytest.raises(RewardFunctionError, match="returned (dict|str|set), expected a list of B floats"):
        score_rewards([lambda p, c: returned], None, ["p", "p"], ["a", "b"])


def test_a_reward_function_that_calls_exit_is_an_error_naming_it():
    def quits(prompts, completions):
        raise SystemExit(3)

    with pytest.raises(RewardFunctionError, match="reward function 'quits' at row 0 .*raised SystemExit: 3"):
        score_rewards([quits], None, ["p"], ["a"])


def test_an_async_reward_function_that_calls_exit_is_an_error_naming_it():
    async def quits_later(prompts, completions):
        raise SystemExit(3)

    with pytest.raises(RewardFunctionError, match="reward function 'quits_later' at row 0 .*raised SystemExit: 3"):
        score_rewards([quits_later], None, ["p"], ["a"])
