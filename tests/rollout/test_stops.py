"""Stop strings end a completion at the token that completes them; text and mask agree."""

from __future__ import annotations

import pytest

from grouprl.rollout.sampler import Sampler
from grouprl.rollout.stops import StopStringMatcher
from grouprl.types import SamplingParams
from tests.helpers.rollout import MULTI, PROMPTS, encode, make_model, make_tokenizer

N = 40


@pytest.fixture(scope="module")
def setup():
    tok = make_tokenizer()
    model = make_model(tok, seed=1)
    ids = encode(tok, PROMPTS)
    free = Sampler(model, tok).generate(ids, 4, SamplingParams(max_new_tokens=N), seed=5)
    rows = [r[:n] for r, n in zip(free.completion_ids.tolist(), free.lengths.tolist())]
    return tok, model, ids, rows


def decode(tok, ids):
    return tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def expected_end(tok, row, stop):
    """Index of the token that completes the first ``stop`` in ``row``, or None."""
    return next((j for j in range(len(row)) if stop in decode(tok, row[: j + 1])), None)


def check_rows(tok, batch, rows, stop):
    """Every row ends exactly where the unconstrained run first completed ``stop`` (same seed, so
    the same tokens up to there), and its text is cut right after the stop string."""
    got = [r[:n] for r, n in zip(batch.completion_ids.tolist(), batch.lengths.tolist())]
    for i, row in enumerate(rows):
        end = expected_end(tok, row, stop)
        if end is None:
            assert got[i] == row and batch.completions[i] == decode(tok, row)
            continue
        assert got[i] == row[: end + 1], f"row {i} should stop at token {end}"
        text = decode(tok, row[: end + 1])
        assert batch.completions[i] == text[: text.index(stop) + len(stop)]
        assert not batch.truncated[i]
        # The cut lies inside the last counted token: text and mask agree on where the row ended.
        assert len(decode(tok, row[:end])) < len(batch.completions[i]) <= len(text)


def test_stop_string_spanning_three_tokens(setup):
    tok, model, ids, rows = setup
    row = rows[5]
    stop = decode(tok, row[7:10])
    assert len(stop) == 3 and stop not in decode(tok, row[:9]), "pick a stop string first completed at token 9"
    batch = Sampler(model, tok).generate(ids, 4, SamplingParams(max_new_tokens=N, stop_strings=(stop,)), seed=5)
    assert batch.lengths[5] == 10
    check_rows(tok, batch, rows, stop)


def test_stop_string_ending_inside_a_multi_character_token(setup):
    tok, model, ids, rows = setup
    multi = {tok.convert_tokens_to_ids(m) for m in MULTI}
    # The first multi-character token (not at the start) of any row, and the text just before it.
    r, k = next((r, k) for r, row in enumerate(rows) for k, t in enumerate(row) if k >= 2 and t in multi)
    piece = decode(tok, rows[r][k : k + 1])
    stop = decode(tok, rows[r][k - 2 : k]) + piece[:1]
    assert stop not in decode(tok, rows[r][:k])
    batch = Sampler(model, tok).generate(ids, 4, SamplingParams(max_new_tokens=N, stop_strings=(stop,)), seed=5)
    assert batch.lengths[r] == k + 1
    assert batch.completions[r] == decode(tok, rows[r][:k]) + piece[:1]
    check_rows(tok, batch, rows, stop)


def test_earliest_of_several_stop_strings_wins(setup):
    tok, model, ids, rows = setup
    a, b = decode(tok, rows[0][3:5]), decode(tok, rows[0][9:12])
    batch = Sampler(model, tok).generate(ids, 4, SamplingParams(max_new_tokens=N, stop_strings=(b, a)), seed=5)
    ends = [e for e in (expected_end(tok, rows[0], a), expected_end(tok, rows[0], b)) if e is not None]
    assert batch.lengths[0] == min(ends) + 1


def test_candidate_table_flags_every_token_that_can_finish_a_stop_string(setup):
    tok = setup[0]
    matcher = StopStringMatcher(tok, ("ND", "x\n"), len(tok))
    flagged = {tok.convert_ids_to_tokens(i) for i in matcher.table.nonzero().flatten().tolist()}
    assert {"D", "END", "\n", "\n\n"} <= flagged
    assert "N" not in flagged and "xyz" not in flagged
    assert matcher.table.float().mean() < 0.1, "only a few tokens need a decode"
