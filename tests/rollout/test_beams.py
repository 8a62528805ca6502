"""Beam groups: the G best beams per prompt, sorted, scored by their tokens' summed log-probs."""

from __future__ import annotations

import torch

from grouprl.rollout.logprobs import token_logprobs
from grouprl.rollout.sampler import Sampler
from grouprl.types import SamplingParams
from tests.helpers.rollout import PROMPTS, make_model

G = 4


def rows_of(batch):
    return [r[:n] for r, n in zip(batch.completion_ids.tolist(), batch.lengths.tolist())]


def check_scores(model, batch, atol=1e-4):
    """Within each group scores are sorted (best first) and equal the recomputed summed log-probs."""
    scores = batch.sampling_logprobs.sum(-1).view(-1, G)  # [P, G]
    assert (scores[:, :-1] >= scores[:, 1:]).all()
    logp, _ = token_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
    torch.testing.assert_close(batch.sampling_logprobs, logp, atol=atol, rtol=0)
    torch.testing.assert_close(scores, logp.sum(-1).view(-1, G), atol=atol, rtol=0)


def test_top_beam_is_greedy_when_greedy_is_optimal(tok, ids):
    model = make_model(tok, seed=3, head_scale=100.0)  # a sharp head: nearly deterministic steps
    greedy = Sampler(model, tok).generate(ids, 1, SamplingParams(max_new_tokens=12, temperature=0.0))
    # Greedy is optimal when its total score beats any single detour: a detour at step t scores at
    # most log(1 - p_t), p_t the greedy token's probability there.
    detour = torch.log1p(-greedy.sampling_logprobs.exp()).masked_fill(greedy.completion_mask == 0, -torch.inf)
    assert (greedy.sampling_logprobs.sum(-1) > detour.max(-1).values).all()
    beams = Sampler(model, tok).generate(ids, G, SamplingParams(max_new_tokens=12, mode="beam"))
    assert rows_of(beams)[::G] == rows_of(greedy)
    # Logits of ~100 leave float32 log-probs ~1e-4 apart between cached and full forwards.
    torch.testing.assert_close(beams.sampling_logprobs.sum(-1)[::G], greedy.sampling_logprobs.sum(-1), atol=1e-3,
                               rtol=0)
    check_scores(model, beams, atol=1e-3)


def test_beams_with_stops_are_sorted_distinct_and_scored(tok, ids):
    model = make_model(tok, seed=1, init_range=0.2)
    params = SamplingParams(max_new_tokens=10, mode="beam", stop_token_ids=(5, 9, 40, 66))
    batch = Sampler(model, tok).generate(ids, G, params)
    check_scores(model, batch)
    rows = rows_of(batch)
    stops = {tok.eos_token_id, 5, 9, 40, 66}
    for i, row in enumerate(rows):
        assert (row[-1] in stops and not batch.truncated[i]) or (len(row) == 10 and batch.truncated[i])
        assert all(t not in stops for t in row[:-1])
    for p in range(len(PROMPTS)):
        assert len({tuple(r) for r in rows[p * G : (p + 1) * G]}) == G
    assert {len(r) for r in rows} != {10}, "some beams should finish early"


def test_beam_temperature_scores_match_token_logprobs_at_that_temperature(tok, ids):
    model = make_model(tok, seed=1, init_range=0.2)
    batch = Sampler(model, tok).generate(ids, G, SamplingParams(max_new_tokens=6, mode="beam", temperature=0.5))
    logp, _ = token_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                             batch.completion_mask, temperature=0.5)
    torch.testing.assert_close(batch.sampling_logprobs, logp, atol=1e-4, rtol=0)


def test_beams_end_at_stop_strings(tok, ids):
    model = make_model(tok, seed=1, init_range=0.2)
    free = Sampler(model, tok).generate(ids, G, SamplingParams(max_new_tokens=10, mode="beam"))
    stop = max(free.completions, key=len)[:2]  # completed by a beam the search keeps
    batch = Sampler(model, tok).generate(ids, G, SamplingParams(max_new_tokens=10, mode="beam", stop_strings=(stop,)))
    check_scores(model, batch)
    assert any(stop in c for c in batch.completions)
    for row, text in zip(rows_of(batch), batch.completions):
        full = tok.decode(row, skip_special_tokens=True)
        if stop in full:
            assert stop not in tok.decode(row[:-1], skip_special_tokens=True), "must end at the completing token"
            assert text == full[: full.index(stop) + len(stop)]
