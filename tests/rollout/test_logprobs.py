"""Chunked per-token log-probs equal the naive full log-softmax, in value and in gradient."""

from __future__ import annotations

import pytest
import torch

from grouprl.rollout.logprobs import split_model, token_logprobs
from tests.helpers.messages import named
from tests.helpers.rollout import PROMPTS, encode, make_model


@pytest.fixture(scope="module")
def batch(tok):
    """Left-padded prompts and right-padded completions of different lengths (one row empty)."""
    gen = torch.Generator().manual_seed(0)
    prompts = encode(tok, PROMPTS)
    lp, t = max(map(len, prompts)), 9
    prompt_ids = torch.zeros(len(prompts), lp, dtype=torch.long)
    prompt_mask = torch.zeros_like(prompt_ids)
    for i, r in enumerate(prompts):
        prompt_ids[i, lp - len(r):] = torch.tensor(r)
        prompt_mask[i, lp - len(r):] = 1
    completion_ids = torch.randint(2, len(tok), (len(prompts), t), generator=gen)
    lengths = torch.tensor([9, 4, 0, 7])
    completion_mask = (torch.arange(t) < lengths[:, None]).float()
    completion_ids = completion_ids.masked_fill(completion_mask == 0, tok.pad_token_id)
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def naive(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature=1.0):
    """Full [B, T, V] float32 log-softmax of the plain forward."""
    ids = torch.cat([prompt_ids, completion_ids], 1)
    attn = torch.cat([prompt_mask, torch.ones_like(completion_ids)], 1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    lp = prompt_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, lp - 1 : -1].float() / temperature
    logp_all = logits.log_softmax(-1)
    logp = logp_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1) * completion_mask
    entropy = -(logp_all.exp() * logp_all).sum(-1) * completion_mask
    return logp, entropy


@pytest.mark.parametrize("chunk_size", [1, 5, None])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_values_and_gradients_match_naive(tok, batch, chunk_size, temperature):
    model = make_model(tok, seed=4)
    weights = torch.randn(batch[2].shape, generator=torch.Generator().manual_seed(1))

    def grads(fn):
        model.zero_grad()
        logp, entropy = fn()
        ((logp * weights).sum() + 0.3 * (entropy * weights).sum()).backward()
        return logp.detach(), entropy.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    got = grads(lambda: token_logprobs(model, *batch, temperature=temperature, chunk_size=chunk_size,
                                       with_entropy=True))
    want = grads(lambda: naive(model, *batch, temperature=temperature))
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=0)
    for name, g in want[2].items():
        torch.testing.assert_close(got[2][name], g, atol=1e-5, rtol=1e-4, msg=named(name))
    assert (got[0][batch[3] == 0] == 0).all() and (got[1][batch[3] == 0] == 0).all()


def test_without_grad_and_in_inference_mode(tok, batch):
    model = make_model(tok, seed=4)
    with torch.no_grad():
        want, _ = naive(model, *batch)
        a, none = token_logprobs(model, *batch)
    with torch.inference_mode():
        b, _ = token_logprobs(model, *batch, chunk_size=3)
    assert none is None and not a.requires_grad
    torch.testing.assert_close(a, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(b, want, atol=1e-5, rtol=0)


def test_lora_model_gets_adapter_gradients_only(tok, batch):
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(make_model(tok, seed=4),
                                peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    assert split_model(model) is not None, "LoRA keeps the chunked head path"
    logp, _ = token_logprobs(model, *batch, chunk_size=4)
    want, _ = naive(model, *batch)
    torch.testing.assert_close(logp, want, atol=1e-5, rtol=0)
    logp.sum().backward()
    trained = {n for n, p in model.named_parameters() if p.grad is not None}
    assert trained and all("lora_" in n for n in trained)
    with model.disable_adapter(), torch.no_grad():
        base, _ = token_logprobs(model, *batch)
        torch.testing.assert_close(base, naive(model.get_base_model(), *batch)[0], atol=1e-5, rtol=0)
    assert not torch.allclose(base, logp.detach())


def test_models_with_logit_softcapping_take_the_plain_forward(tok, batch):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, vocab_size=len(tok), final_logit_softcapping=5.0,
                          pad_token_id=0, eos_token_id=1, bos_token_id=None)
    model = Gemma2ForCausalLM(config).eval()
    assert split_model(model) is None
    logp, entropy = token_logprobs(model, *batch, chunk_size=2, with_entropy=True)
    want = naive(model, *batch)
    torch.testing.assert_close(logp, want[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, want[1], atol=1e-5, rtol=0)


def test_mismatched_shapes_fail_clearly(tok, batch):
    prompt_ids, prompt_mask, completion_ids, completion_mask = batch
    with pytest.raises(ValueError, match="same shapes"):
        token_logprobs(make_model(tok), prompt_ids, prompt_mask, completion_ids, completion_mask[:, :3])
