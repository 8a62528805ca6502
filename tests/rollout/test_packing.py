"""The padding-free layout: its construction on a hand-built batch, and log-probs and gradients
equal to the padded layout's (sdpa and eager attention, LoRA, groups split across micro-batches)."""

from __future__ import annotations

import pytest
import torch

from grouprl.models import LoraSettings, apply_lora
from grouprl.registry import Registry
from grouprl.rollout import logprobs
from grouprl.rollout.logprobs import token_logprobs
from grouprl.rollout.packing import pack_groups
from tests.helpers.messages import named
from tests.helpers.rollout import PROMPTS, encode, make_model


def test_layout_of_a_hand_built_batch():
    # Two groups: prompt [7, 8, 9] with completions [1, 2, 3] and [4]; prompt [5, 6] with [2, 3, 4, 5]
    # and an empty one. Prompts are left-padded to 3 columns, completions right-padded to 4.
    prompt_ids = torch.tensor([[7, 8, 9], [7, 8, 9], [0, 5, 6], [0, 5, 6]])
    prompt_mask = torch.tensor([[1, 1, 1], [1, 1, 1], [0, 1, 1], [0, 1, 1]])
    completion_ids = torch.tensor([[1, 2, 3, 0], [4, 0, 0, 0], [2, 3, 4, 5], [0, 0, 0, 0]])
    completion_mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]).float()
    p = pack_groups(prompt_ids, prompt_mask, completion_ids, completion_mask)
    # Sequence 0: prompt 7 8 9, then row 0's tokens 1 2 (its last token 3 predicts nothing); row 1
    # feeds nothing. Sequence 1: prompt 5 6, then row 2's tokens 2 3 4. Width 5.
    assert p.input_ids.tolist() == [[7, 8, 9, 1, 2], [5, 6, 2, 3, 4]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]
    # Predictors, in the mask's row-major order: row 0 tokens 0..2 <- positions 2, 3, 4 of sequence 0;
    # row 1 token 0 <- position 2 (the last prompt token); row 2 tokens 0..3 <- 1, 2, 3, 4 of sequence 1.
    assert p.predictor.tolist() == [2, 3, 4, 2, 6, 7, 8, 9]
    assert p.allowed[0].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1],
    ]


def test_completions_of_one_group_do_not_see_each_other():
    prompt_ids = torch.tensor([[3, 4], [3, 4], [3, 4]])
    prompt_mask = torch.ones_like(prompt_ids)
    completion_ids = torch.tensor([[5, 6, 1], [7, 8, 1], [9, 1, 0]])
    completion_mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 0]]).float()
    p = pack_groups(prompt_ids, prompt_mask, completion_ids, completion_mask)
    # [3 4 | 5 6 | 7 8 | 9]: positions restart at 2 for every completion.
    assert p.input_ids.tolist() == [[3, 4, 5, 6, 7, 8, 9]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 2, 3, 2]]
    a = p.allowed[0].int()
    assert a[4].tolist() == [1, 1, 0, 0, 1, 0, 0]  # row 1's first token: the prompt and itself
    assert a[6].tolist() == [1, 1, 0, 0, 0, 0, 1]  # row 2's first token
    assert a[3].tolist() == [1, 1, 1, 1, 0, 0, 0]  # row 0's second token
    # Row 1's tokens 7, 8, 1 are predicted by the last prompt position, then by 7 and 8.
    assert p.predictor.tolist()[3:6] == [1, 4, 5]


def test_short_sequences_share_a_row_and_see_only_themselves():
    # Three prompts, one row each: lengths 2 + 4 - 1 = 5, 2 + 2 - 1 = 3, 1 + 2 - 1 = 2. Width 5:
    # the first fills a row, the other two share the second.
    prompt_ids = torch.tensor([[3, 4], [5, 6], [0, 7]])
    prompt_mask = torch.tensor([[1, 1], [1, 1], [0, 1]])
    completion_ids = torch.tensor([[8, 9, 10, 1], [11, 1, 0, 0], [12, 1, 0, 0]])
    completion_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]]).float()
    p = pack_groups(prompt_ids, prompt_mask, completion_ids, completion_mask)
    assert p.input_ids.tolist() == [[3, 4, 8, 9, 10], [5, 6, 11, 7, 12]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]]
    assert p.allowed[1].int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [0, 0, 0, 1, 0],  # the third prompt starts afresh
        [0, 0, 0, 1, 1],
    ]
    # Row 2's tokens 12, 1 are predicted from flat positions 5 + 3 (its prompt) and 5 + 4.
    assert p.predictor.tolist() == [1, 2, 3, 4, 6, 7, 8, 9]


def grouped_batch(tok, group_size=3, t=8, seed=0):
    """Prompts of different lengths, each repeated for its group, completions of ragged lengths."""
    gen = torch.Generator().manual_seed(seed)
    prompts = encode(tok, PROMPTS)
    lp = max(map(len, prompts))
    rows = [r for r in prompts for _ in range(group_size)]
    prompt_ids = torch.zeros(len(rows), lp, dtype=torch.long)
    prompt_mask = torch.zeros_like(prompt_ids)
    for i, r in enumerate(rows):
        prompt_ids[i, lp - len(r):] = torch.tensor(r)
        prompt_mask[i, lp - len(r):] = 1
    lengths = torch.randint(0, t + 1, (len(rows),), generator=gen)
    lengths[0] = t
    completion_mask = (torch.arange(t) < lengths[:, None]).float()
    completion_ids = torch.randint(2, len(tok), (len(rows), t), generator=gen).masked_fill(completion_mask == 0, 0)
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def grads_of(model, batch, **kw):
    weights = torch.randn(batch[2].shape, generator=torch.Generator().manual_seed(1))
    model.zero_grad()
    logp, ent = token_logprobs(model, *batch, with_entropy=True, **kw)
    ((logp * weights).sum() + 0.3 * (ent * weights).sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), ent.detach(), grads


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_equals_padded_in_value_and_gradient(tok, attention):
    model = make_model(tok, seed=4)
    model.config._attn_implementation = attention
    batch = grouped_batch(tok)
    assert logprobs._packed_features(model, *batch) is not None  # the packed path really runs
    got = grads_of(model, batch, packed=True, temperature=0.7)
    want = grads_of(model, batch, packed=False, temperature=0.7)
    torch.testing.assert_close(got[0], want[0], atol=2e-5, rtol=0)
    torch.testing.assert_close(got[1], want[1], atol=2e-5, rtol=0)
    assert got[2].keys() == want[2].keys()
    for name, g in want[2].items():
        torch.testing.assert_close(got[2][name], g, atol=2e-5, rtol=1e-4, msg=named(name))


def test_packed_equals_padded_with_lora(tok):
    model = apply_lora(make_model(tok, seed=4), LoraSettings(rank=4, alpha=8, target_modules=("q_proj", "v_proj")))
    with torch.no_grad():  # non-zero adapters, so their gradients depend on the layout too
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(2))
    batch = grouped_batch(tok, seed=3)
    got, want = grads_of(model, batch, packed=True), grads_of(model, batch, packed=False)
    torch.testing.assert_close(got[0], want[0], atol=2e-5, rtol=0)
    assert got[2] and all("lora_" in n for n in got[2])
    for name, g in want[2].items():
        torch.testing.assert_close(got[2][name], g, atol=2e-5, rtol=1e-4, msg=named(name))


def test_a_group_split_across_micro_batches_and_rows_without_a_shared_prompt(tok):
    model = make_model(tok, seed=5)
    batch = grouped_batch(tok, group_size=4, seed=6)
    with torch.no_grad():
        want, _ = token_logprobs(model, *batch)
        for rows in (torch.arange(2, 7), torch.tensor([0, 5, 9, 3])):  # a group cut in two; no two rows alike
            got, _ = token_logprobs(model, *(x[rows] for x in batch), packed=True)
            torch.testing.assert_close(got, want[rows], atol=2e-5, rtol=0)


class WholeForward(torch.nn.Module):
    """Like DistributedDataParallel: holds the model as ``.module`` and must be called as a whole."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, **kwargs):
        return self.module(**kwargs)


def test_a_wrapper_that_must_run_whole_packs_through_its_own_forward(tok):
    model = make_model(tok, seed=4)
    wrapped = WholeForward(model)
    assert logprobs.split_model(wrapped) is None and logprobs._packed_features(wrapped, *grouped_batch(tok)) is not None
    batch = grouped_batch(tok, seed=8)
    got, want = grads_of(wrapped, batch, packed=True), grads_of(model, batch, packed=False)
    torch.testing.assert_close(got[0], want[0], atol=2e-5, rtol=0)
    torch.testing.assert_close(got[1], want[1], atol=2e-5, rtol=0)
    for name, g in want[2].items():
        torch.testing.assert_close(got[2]["module." + name], g, atol=2e-5, rtol=1e-4, msg=named(name))


def test_models_without_a_custom_mask_take_the_padded_layout(tok, monkeypatch):
    model = make_model(tok, seed=4)
    batch = grouped_batch(tok)
    with torch.no_grad():
        want, _ = token_logprobs(model, *batch)
        monkeypatch.setattr(logprobs, "MASK_FORMS", Registry("attention implementation"))  # sdpa unsupported
        got, _ = token_logprobs(model, *batch, packed=True)
    torch.testing.assert_close(got, want, atol=0, rtol=0)  # bit for bit: the same padded computation
