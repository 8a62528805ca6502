"""The sampling engine against ``model.generate``, itself and ``token_logprobs``."""

from __future__ import annotations

import pytest
import torch

from grouprl.registry import UnknownNameError
from grouprl.rollout.decoding import rows_to_keep
from grouprl.rollout.logprobs import token_logprobs
from grouprl.rollout.runner import Runner
from grouprl.rollout.sampler import Sampler
from grouprl.types import SamplingParams
from tests.helpers.rollout import PROMPTS, make_model


@pytest.fixture(scope="module")
def model(tok):
    return make_model(tok, seed=1)


def hf_greedy(model, tok, ids, max_new, eos_ids, **kw):
    """``model.generate`` greedy completions, each cut after its first stop token (lists of ids)."""
    width = max(map(len, ids))
    inp = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in ids])
    attn = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids])
    out = model.generate(input_ids=inp, attention_mask=attn, do_sample=False, max_new_tokens=max_new,
                         eos_token_id=eos_ids, pad_token_id=tok.pad_token_id, **kw)[:, width:]
    rows = []
    for row in out.tolist():
        ends = [i for i, t in enumerate(row) if t in eos_ids]
        rows.append(row[: ends[0] + 1] if ends else row)
    return rows


def completions(batch):
    return [row[:n] for row, n in zip(batch.completion_ids.tolist(), batch.lengths.tolist())]


def test_greedy_matches_generate_with_rows_finishing_at_different_steps(model, tok, ids):
    n = 24
    free = completions(Sampler(model, tok).generate(ids, 1, SamplingParams(max_new_tokens=n, temperature=0.0)))
    # Stop tokens taken from the unconstrained run, so rows end at different steps and the
    # engine drops them from the batch while generate keeps decoding them.
    stops = (free[0][4], free[2][11])
    eos = [tok.eos_token_id, *stops]
    params = SamplingParams(max_new_tokens=n, temperature=0.0, stop_token_ids=stops)
    batch = Sampler(model, tok).generate(ids, 2, params)
    ref = hf_greedy(model, tok, ids, n, eos)
    assert len({len(r) for r in ref}) >= 3, "the test needs rows of different lengths"
    assert completions(batch) == [r for r in ref for _ in range(2)]
    assert batch.truncated.tolist() == [len(r) == n and r[-1] not in eos for r in ref for _ in range(2)]


def test_greedy_repetition_penalty_matches_generate(model, tok, ids):
    params = SamplingParams(max_new_tokens=16, temperature=0.0, repetition_penalty=1.8)
    batch = Sampler(model, tok).generate(ids, 1, params)
    assert completions(batch) == hf_greedy(model, tok, ids, 16, [tok.eos_token_id], repetition_penalty=1.8)


def test_seeded_sampling_is_reproducible(model, tok, ids):
    sampler = Sampler(model, tok)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.9)
    a, b = (sampler.generate(ids, 3, params, seed=7) for _ in range(2))
    c = sampler.generate(ids, 3, params, seed=8)
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.sampling_logprobs, b.sampling_logprobs)
    assert a.completions == b.completions
    assert not torch.equal(a.completion_ids, c.completion_ids)
    # Samples within a group differ (they are independent draws, not copies).
    assert len(set(a.completions[:3])) > 1


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_sampling_logprobs_equal_recomputed_logprobs(model, tok, ids, temperature):
    params = SamplingParams(max_new_tokens=20, temperature=temperature, stop_token_ids=(5, 9))
    batch = Sampler(model, tok).generate(ids, 3, params, seed=0)
    logp, _ = token_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                             batch.completion_mask, temperature=temperature)
    torch.testing.assert_close(batch.sampling_logprobs, logp, atol=1e-4, rtol=0)
    assert (batch.sampling_logprobs[batch.completion_mask == 0] == 0).all()


def test_dropping_finished_rows_changes_nothing(model, tok, ids):
    params = SamplingParams(max_new_tokens=30, temperature=1.0, stop_token_ids=(5, 9, 40))
    kept = Sampler(model, tok, compact=False).generate(ids, 4, params, seed=3)
    dropped = Sampler(model, tok).generate(ids, 4, params, seed=3)
    assert len(set(dropped.lengths.tolist())) > 4, "rows must finish at different steps"
    assert torch.equal(kept.completion_ids, dropped.completion_ids)
    torch.testing.assert_close(kept.sampling_logprobs, dropped.sampling_logprobs, atol=1e-5, rtol=0)


def test_rows_to_keep_tops_up_the_running_rows_with_finished_ones():
    running = torch.tensor([False, True, False, False, True])
    assert rows_to_keep(running, 1).tolist() == [1, 4]
    assert rows_to_keep(running, 2).tolist() == [1, 4]
    assert rows_to_keep(running, 3).tolist() == [0, 1, 4]
    assert rows_to_keep(torch.tensor([False, False, True, False]), 2).tolist() == [0, 2]
    assert rows_to_keep(torch.tensor([True]), 2).tolist() == [0]  # no finished row to pad with


def test_keeping_finished_rows_to_pad_the_batch_changes_nothing(model, tok, ids, monkeypatch):
    """A compiled step needs 2 rows; with 3 the padding shows over more steps. Finished rows decode on
    beside the last running ones and what they draw past their end is cut."""
    params = SamplingParams(max_new_tokens=60, temperature=1.0, stop_token_ids=(5, 9, 40, 17, 33))
    dropped = Sampler(model, tok).generate(ids, 4, params, seed=3)
    last = sorted(dropped.lengths.tolist())[-3:]
    assert last[0] < last[1] < last[2], "the last three rows must end at different steps"
    rows_seen = []
    forward = Runner.forward

    def spy(self, step_ids, mask, positions):
        if step_ids.shape[1] == 1:
            rows_seen.append(step_ids.shape[0])
        return forward(self, step_ids, mask, positions)

    monkeypatch.setattr(Runner, "fewest_rows", property(lambda self: 3))
    monkeypatch.setattr(Runner, "forward", spy)
    padded = Sampler(model, tok).generate(ids, 4, params, seed=3)
    assert min(rows_seen) == 3
    assert torch.equal(padded.completion_ids, dropped.completion_ids)
    assert torch.equal(padded.lengths, dropped.lengths) and torch.equal(padded.truncated, dropped.truncated)
    torch.testing.assert_close(padded.sampling_logprobs, dropped.sampling_logprobs, atol=1e-5, rtol=0)


def test_shared_prefill_matches_independent_prefills(model, tok, ids):
    params = SamplingParams(max_new_tokens=16, temperature=1.0)
    shared = Sampler(model, tok).generate(ids, 4, params, seed=11)
    alone = Sampler(model, tok, share_prefill=False).generate(ids, 4, params, seed=11)
    # Same uniforms per row, so the same distributions must give the same tokens and log-probs.
    assert torch.equal(shared.completion_ids, alone.completion_ids)
    torch.testing.assert_close(shared.sampling_logprobs, alone.sampling_logprobs, atol=1e-5, rtol=0)


def test_batch_layout(model, tok, ids):
    params = SamplingParams(max_new_tokens=10, temperature=1.0, stop_token_ids=(5, 9, 40))
    batch = Sampler(model, tok).generate(ids, 3, params, seed=1, prompts=PROMPTS, extras={"answer": [1, 2, 3, 4]})
    b = len(PROMPTS) * 3
    assert batch.batch_size == b and batch.group_size == 3 and batch.num_prompts == len(PROMPTS)
    assert batch.prompts == [p for p in PROMPTS for _ in range(3)]
    assert batch.extras == {"answer": [a for a in (1, 2, 3, 4) for _ in range(3)]}
    assert batch.prompt_ids.shape == batch.prompt_mask.shape == (b, max(map(len, ids)))
    for row, r in enumerate(ids):
        assert batch.prompt_ids[row * 3 + 2][batch.prompt_mask[row * 3 + 2] == 1].tolist() == r
    assert batch.completion_mask.dtype == torch.float32
    pad = batch.completion_mask == 0
    assert (batch.completion_ids[pad] == tok.pad_token_id).all()
    stopped = torch.isin(batch.completion_ids.gather(1, batch.lengths.unsqueeze(1) - 1).squeeze(1),
                         torch.tensor([5, 9, 40, tok.eos_token_id]))
    assert torch.equal(batch.truncated, ~stopped & (batch.lengths == 10))
    assert batch.completions == tok.batch_decode(completions(batch), skip_special_tokens=True)
    # Usable in a loss that is differentiated (inference-mode tensors cannot be saved for backward).
    tensors = [v for v in vars(batch).values() if isinstance(v, torch.Tensor)]
    assert len(tensors) == 6 and not any(t.is_inference() for t in tensors)
    w = torch.ones(batch.completion_mask.shape, requires_grad=True)
    (w * batch.completion_mask * batch.sampling_logprobs).sum().backward()


def test_bf16_autocast_runs_and_leaves_the_model_alone(model, tok, ids):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = SamplingParams(max_new_tokens=12, temperature=1.0, format="bf16")
    batch = Sampler(model, tok).generate(ids, 2, params, seed=0)
    after = model.state_dict()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())
    logp, _ = token_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
    # bf16 has ~3 significant digits; the fp32 scores of the same tokens stay close.
    assert (batch.sampling_logprobs - logp).abs().max() < 0.1


def test_peft_wrapped_model(model, tok, ids):
    peft = pytest.importorskip("peft")
    lora = peft.get_peft_model(make_model(tok, seed=1),
                               peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    batch = Sampler(lora, tok).generate(ids, 2, params, seed=0)
    logp, _ = token_logprobs(lora, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
    torch.testing.assert_close(batch.sampling_logprobs, logp, atol=1e-4, rtol=0)
    base = Sampler(model, tok).generate(ids, 2, params, seed=0)
    assert not torch.equal(base.completion_ids, batch.completion_ids), "the adapters must change the samples"


def test_model_training_flag_is_restored(tok, ids):
    m = make_model(tok).train()
    Sampler(m, tok).generate(ids, 1, SamplingParams(max_new_tokens=2))
    assert m.training


@pytest.mark.parametrize(
    ("kwargs", "params", "match"),
    [
        ({"group_size": 0}, SamplingParams(), "group_size"),
        ({"prompt_ids": []}, SamplingParams(), "at least one prompt"),
        ({"prompt_ids": [[3, 4], []]}, SamplingParams(), "prompt 1 has no tokens"),
        ({"prompt_ids": [[3, 10_000]]}, SamplingParams(), "outside the model's vocabulary"),
        ({"extras": {"answer": [1]}}, SamplingParams(), "extras column 'answer'"),
        ({"prompts": ["a"]}, SamplingParams(), "prompts has 1 entries"),
        ({}, SamplingParams(top_p=0.0), "top_p"),
        ({}, SamplingParams(temperature=-1.0), "temperature"),
        ({}, SamplingParams(max_new_tokens=0), "max_new_tokens"),
        ({}, SamplingParams(mode="beam", top_k=5), "unset top_k"),
        ({}, SamplingParams(stop_strings=("",)), "empty string"),
    ],
)
def test_bad_input_fails_clearly(model, tok, ids, kwargs, params, match):
    call = {"prompt_ids": ids, "group_size": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        Sampler(model, tok).generate(call.pop("prompt_ids"), call.pop("group_size"), params, **call)


def test_unknown_mode_lists_valid_modes(model, tok, ids):
    with pytest.raises(UnknownNameError, match="beam, sample"):
        Sampler(model, tok).generate(ids, 2, SamplingParams(mode="nucleus"))
