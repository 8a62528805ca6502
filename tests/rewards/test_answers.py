"""Final answers (grouprl.rewards.answers): a hand-checked table of 150+ cases, the reference
scorers users know run on the same table, gold formats, and hostile completions."""

import re
import shutil
import threading
from pathlib import Path

import pytest

from grouprl.rewards import exact_match, make_reward, math_equivalence, symbolic
from grouprl.rewards.answers import (
    answer_is_correct,
    answers_correct,
    check_golds,
    completion_answer,
    gold_answer,
    same_answer,
)
from grouprl.rewards.symbolic import MAX_DEPTH, equal_all
from tests.rewards.answer_cases_gsm8k import CASES as GSM8K_CASES
from tests.rewards.answer_cases_math import CASES as MATH_CASES
from tests.rewards.answer_cases_tags import CASES as TAG_CASES
from tests.rewards.answer_disagreements import TRL, VERL_GSM8K

CASES = GSM8K_CASES + MATH_CASES + TAG_CASES
DOCS = Path(__file__).resolve().parents[2] / "docs" / "answers.md"


def test_the_table_is_large_and_each_case_is_named_once():
    ids = [case[0] for case in CASES]
    assert len(ids) >= 150 and len(set(ids)) == len(ids)
    assert all(expected in (0, 1) and why for _, _, _, expected, why in CASES)
    assert sum(expected for *_, expected, _ in CASES) not in (0, len(CASES))  # both outcomes are exercised


@pytest.mark.parametrize(("case_id", "completion", "gold", "expected", "why"), CASES, ids=[c[0] for c in CASES])
def test_math_equivalence_scores_every_case_as_checked_by_hand(case_id, completion, gold, expected, why):
    assert math_equivalence(None, [completion], answer=[gold]) == [float(expected)], why


def test_accuracy_is_math_equivalence():
    assert make_reward("accuracy") is math_equivalence
    # The reported failure: the project's own tags against a plain and a GSM8K gold.
    assert make_reward("accuracy")(None, ["<answer>72</answer>"] * 2, answer=["72", "So 48 + 24 = 72.\n#### 72"]) \
        == [1.0, 1.0]


def test_exact_match_agrees_with_the_table_off_symbolic_math():
    """exact_match has no symbolic algebra, but numbers, GSM8K golds and text score the same."""
    cases = GSM8K_CASES + TAG_CASES
    scores = exact_match(None, [c[1] for c in cases], answer=[c[2] for c in cases])
    wrong = [case[0] for case, score in zip(cases, scores) if score != case[3]]
    assert wrong == []
    # Symbolic equality is math_equivalence's: exact_match still reads a MATH box and compares numbers.
    assert exact_match(None, [r"\boxed{1+x^2}", r"\boxed{0.75}"], answer=[r"$\boxed{x^2 + 1}$", r"$\boxed{\frac34}$"]) \
        == [0.0, 0.0]
    assert exact_match(None, [r"\boxed{0.75}"], answer=[r"$\boxed{\frac{3}{4}}$"]) == [1.0]


# ---- the reference scorers, on the same table -------------------------------------------------


def trl_accuracy(completion, gold):
    """math-verify called the way TRL's ``accuracy_reward`` calls it: the gold parsed with the default
    configuration (None when that finds nothing: TRL skips the row), the completion parsed as LaTeX
    only, boxes first, first match."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify

    gold_parsed = parse(str(gold), parsing_timeout=10)
    if not gold_parsed:
        return None
    config = LatexExtractionConfig(normalization_config=NormalizationConfig(units=True), boxed_match_priority=0,
                                   try_extract_without_anchor=False)
    pred = parse(completion, extraction_config=[config], extraction_mode="first_match", parsing_timeout=10)
    return int(verify(gold_parsed, pred, timeout_seconds=5))


GSM8K_NUMBER = re.compile(r"#### (\-?[0-9\.\,]+)")


def verl_gsm8k_strict(completion, gold):
    """verl's GSM8K rule (verl/utils/reward_score/gsm8k.py, method "strict"): the last '#### number'
    in the completion's final 300 characters, commas and dollars dropped, equal as a string to the
    gold that verl's GSM8K preprocessing keeps (the number after '#### ', commas dropped)."""
    found = GSM8K_NUMBER.findall(completion[-300:])
    truth = GSM8K_NUMBER.search(gold).group(1).replace(",", "")
    return int(bool(found) and found[-1].replace(",", "").replace("$", "") == truth)


def test_disagreements_with_trl_accuracy_reward_are_the_documented_ones():
    found = {case_id: score for case_id, completion, gold, expected, _ in CASES
             if (score := trl_accuracy(completion, gold)) != expected}
    assert found == TRL


def test_disagreements_with_verl_gsm8k_strict_are_the_documented_ones():
    gsm8k = [case for case in CASES if isinstance(case[2], str) and "####" in case[2]]
    assert len(gsm8k) >= 60
    found = {case_id: score for case_id, completion, gold, expected, _ in gsm8k
             if (score := verl_gsm8k_strict(completion, gold)) != expected}
    assert found == VERL_GSM8K


def test_the_docs_give_a_reason_for_every_disagreement():
    text = DOCS.read_text()
    trl_part, verl_part = text.split("## Against TRL", 1)[1].split("## Against verl", 1)
    assert [i for i in TRL if f"`{i}`" not in trl_part] == []
    assert [i for i in VERL_GSM8K if f"`{i}`" not in verl_part] == []
    assert f"{len(CASES)} cases" in text and f"{len(TRL)} disagreements" in trl_part
    assert f"{len(VERL_GSM8K)} disagreements" in verl_part
    assert f"the {len([c for c in CASES if isinstance(c[2], str) and '####' in c[2]])} cases" in verl_part


# ---- gold values ------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [
    ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", "72"),
    ("Step one.\n#### 1,200\n", "1,200"),
    (r"So $\boxed{\frac{\sqrt{3}}{2}}$.", r"\frac{\sqrt{3}}{2}"),
    (r"First $\boxed{1}$, then $\boxed{\{1, 2\}}$.", r"\{1, 2\}"),
    ("<think>t</think><answer> 15 </answer>", "15"),
    (72, "72"), (-3, "-3"), (0.5, "0.5"), (" Paris ", "Paris"), ("\u22125", "-5"),
    (None, None), ("", None), ("   ", None), ("#### ", None), (float("nan"), None), (float("inf"), None),
    (r"So $\boxed{3", None), ([1, 2], None), ({"answer": 3}, None),
])
def test_gold_answer_reads_gsm8k_math_and_plain_values(value, expected):
    assert gold_answer(value) == expected


def test_check_golds_counts_the_golds_without_an_answer_and_shows_one():
    assert check_golds(["#### 72", 5, r"$\boxed{x}$", "Paris"]) == (0, None)
    assert check_golds(["#### 72", None, "", r"\boxed{3", 4.0]) == (3, "None")
    count, example = check_golds([float("nan"), "x" * 500 + r"\boxed{"])
    assert count == 2 and example == "nan"
    assert check_golds([]) == (0, None)


# ---- the multiple-candidates rule --------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("<answer>12 or 15</answer>", None),
    ("<answer>12</answer><answer>15</answer>", None),
    ("<answer>12</answer><answer>12.0</answer>", "12.0"),
    (r"\boxed{12} \boxed{15}", None),
    (r"\boxed{\frac{1}{2}} \boxed{0.5}", "0.5"),  # one value, two spellings
    (r"<answer>\boxed{12} \boxed{15}</answer>", None),
    ("the answer is 12 or maybe 15", None),
    ("it is 12, or perhaps 15", None),
    ("it is 12 or 12", "12"),
    ("12 and 15", "15"),  # no alternative offered: the last number
    ("#### 12\n#### 15", None),
    ("<answer>maybe 15</answer>", "15"),
    ("The answer is 15. It is not 12 or 13.", "15"),  # the phrase decides, the hedge after it is not read
])
def test_several_different_candidates_are_no_answer(text, expected):
    assert completion_answer(text) == expected


def test_same_answer_rules():
    assert same_answer("25%", "25") and not same_answer("25%", "0.25")  # percent is a unit
    assert same_answer("72.000", "72") and same_answer("-0", "0") and not same_answer("7.2", "72")
    assert same_answer(r"\left[ 1, 2 \right)", "[1,2)") and same_answer(r"\$1,\!000", "1000")
    assert not same_answer("5 pi", "5") and not same_answer("2 sqrt 2", "2")  # words that change a value
    assert not same_answer("", "") and not same_answer("72", None)


# ---- hostile completions: every one gets a score, none runs away -------------------------------


def hostile_cases():
    nested_boxes = "\\boxed{" * 2000 + "7" + "}" * 2000
    deep_braces = "\\boxed{" + "{" * 30 + "1" + "}" * 30 + "}"
    return [
        ("100 KB of prose ending in the answer", ("word 3 " * 14_000) + "<answer>72</answer>", "72", 1.0),
        ("100 KB of unclosed boxes", "\\boxed{" * 14_000 + " 72", "72", 1.0),
        ("100 KB of unclosed tags", "<answer>" * 12_000 + "72", "72", 1.0),
        ("100 KB of answer phrases", "answer: 1. " * 9_000 + "answer: 72", "72", 1.0),
        ("100 KB of digits", "<answer>" + "9" * 100_000 + "</answer>", "9" * 99_999 + "8", 0.0),
        ("the same 100 KB number", "<answer>" + "9" * 100_000 + "</answer>", "9" * 100_000, 1.0),
        ("2000 boxes nested", nested_boxes, "7", 0.0),
        ("braces nested 30 deep", deep_braces, "1", 0.0),
        ("a power tower", r"\boxed{9^{9^{9^{9}}}}", "1", 0.0),
        ("a huge exponent", r"\boxed{2^{99999999}}", "1", 0.0),
        ("parentheses nested 200 deep", "\\boxed{" + "(" * 200 + "x" + ")" * 200 + "}", "x", 0.0),
        ("a 5000-character expression", "\\boxed{" + "+".join(["x"] * 2500) + "}", "2500x", 0.0),
    ]


def score_hostile():
    cases = hostile_cases()
    return math_equivalence(None, [c[1] for c in cases], answer=[c[2] for c in cases])


def test_hostile_completions_get_a_score_in_the_main_thread():
    assert score_hostile() == [expected for *_, expected in hostile_cases()]


def in_a_thread(fn):
    """``fn()`` run in a new thread: its result, or its exception raised here."""
    outcome = {}

    def run():
        try:
            outcome["result"] = fn()
        except Exception as e:  # noqa: BLE001 - handed to the calling thread
            outcome["error"] = e

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def test_hostile_completions_get_the_same_score_outside_the_main_thread():
    """math-verify's timeouts (SIGALRM) work only in the main thread: elsewhere the symbolic
    comparisons of a batch run in a child process, after the same caps, and score the same."""
    assert in_a_thread(score_hostile) == [expected for *_, expected in hostile_cases()]
    pairs = [(r"\boxed{0.5}", r"$\boxed{\frac{2}{4}}$"), (r"\boxed{1+x^2}", "x^2+1"),
             (r"\boxed{(x+1)^2}", "x^2+2x+1"), (r"\boxed{x^3}", "x^2")]
    assert in_a_thread(lambda: answers_correct(*zip(*pairs))) == [True, True, True, False]


@pytest.mark.slow
def test_sympy_that_runs_for_minutes_is_cut_off_in_any_thread():
    """Without a timeout, sympy compares these two for minutes (over 240 s in a worker thread here)."""
    slow = "(a+b+c+d+e+f+g+h+1)^{12}", "(a+b+c+d+e+f+g+h+2)^{12}"
    assert same_answer(*slow) is False
    assert in_a_thread(lambda: same_answer(*slow)) is False


def test_a_child_that_overruns_is_killed_and_its_pairs_score_false():
    pairs = [("x^2+1", "1+x^2"), ("x", "x")]
    assert in_a_thread(lambda: equal_all(pairs)) == [True, True]
    assert in_a_thread(lambda: equal_all(pairs, child_limit=0.01)) == [False, False]


def test_a_child_that_cannot_run_is_an_error(monkeypatch):
    monkeypatch.setattr(symbolic.sys, "executable", shutil.which("false"))
    with pytest.raises(RuntimeError, match="math-verify's child process failed"):
        in_a_thread(lambda: equal_all([("x", "x")]))


def test_nesting_up_to_the_cap_still_reaches_math_verify():
    inner = "{" * (MAX_DEPTH - 2) + "x^2+1" + "}" * (MAX_DEPTH - 2)
    assert answer_is_correct(r"\boxed{" + inner + "}", "1+x^2")
