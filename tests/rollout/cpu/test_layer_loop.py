"""Decode steps through the layer loop: the ``transformers`` forward's logits bit for bit, for each family
it covers (left padding, GQA, biases, Qwen3's head norms, LoRA layers, bf16 copies), and the forward
kept for what it does not cover."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from grouprl.rollout.cpu.layer_loop import LayerLoop
from grouprl.rollout.runner import Runner, left_pad, positions_from_mask, run_with_bf16_weights
from grouprl.rollout.sampler import Sampler
from grouprl.types import SamplingParams
from tests.helpers.rollout import PROMPTS, encode, make_model, make_tokenizer

SIZES = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=120, max_position_embeddings=256, tie_word_embeddings=False)


def build(family: str, **extra) -> torch.nn.Module:
    torch.manual_seed(0)
    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
                             "qwen3": (Qwen3Config, Qwen3ForCausalLM),
                             "mistral": (MistralConfig, MistralForCausalLM)}[family]
    kwargs = {**SIZES, **extra}
    if family == "mistral":
        kwargs.setdefault("sliding_window", None)
    model = model_cls(config_cls(**kwargs)).eval()
    with torch.no_grad():  # biases and norm weights away from their 0 / 1 start, so a slip in them shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def decode(model: torch.nn.Module, loop: bool, steps: int = 5) -> list[torch.Tensor]:
    """Logits of a prefill of three left-padded rows and ``steps`` decode steps (fixed tokens)."""
    ids, mask = left_pad([[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]], 0, torch.device("cpu"))
    runner = Runner(model, ids.shape[1] + steps + 1)
    if not loop:
        runner._loop = None
    assert (runner._loop is not None) == loop
    out = [runner.forward(ids, mask, positions_from_mask(mask))]
    for s in range(steps):
        mask = torch.cat([mask, torch.ones(3, 1, dtype=mask.dtype)], 1)
        token = torch.tensor([[20 + s], [40 + s], [60 + s]])
        out.append(runner.forward(token, mask, positions_from_mask(mask)[:, -1:]))
    return out


@pytest.mark.parametrize("family,extra", [("llama", {}), ("llama", {"attention_bias": True, "mlp_bias": True}),
                                          ("llama", {"tie_word_embeddings": True}),
                                          ("qwen2", {}), ("qwen3", {}), ("mistral", {})])
@pytest.mark.parametrize("bf16", [False, True])
def test_the_loop_is_the_forward_bit_for_bit(family, extra, bf16):
    model = build(family, **extra)
    with torch.inference_mode():
        if bf16:
            got = run_with_bf16_weights(model, lambda m: decode(m, loop=True))
            want = run_with_bf16_weights(model, lambda m: decode(m, loop=False))
        else:
            got, want = decode(model, loop=True), decode(model, loop=False)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.float32 and g.shape == (3, SIZES["vocab_size"])
        assert torch.equal(g, w)
    assert not torch.equal(got[1], got[2])  # the steps see their new tokens


def test_lora_layers_are_called_as_modules():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(build("llama"), LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"]))
    with torch.no_grad():  # B starts at zero: make the adapters matter
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    with torch.inference_mode():
        got, want = decode(model, loop=True), decode(model, loop=False)
        model.disable_adapter_layers()
        without = decode(model, loop=True)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    assert not torch.equal(got[-1], without[-1])


@pytest.mark.parametrize("model", [
    lambda: build("mistral", sliding_window=8),
    lambda: build("qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=0),
    lambda: Gemma2ForCausalLM(Gemma2Config(**SIZES, head_dim=16)),
], ids=["mistral-sliding", "qwen2-sliding", "gemma2"])
def test_other_models_keep_the_transformers_forward(model):
    assert LayerLoop.plan(model()) is None


def test_prefills_training_mode_and_foreign_caches_keep_the_forward():
    model = build("llama")
    loop = LayerLoop.plan(model)
    runner = Runner(model, 16)
    assert loop is not None and loop.covers(runner.cache, torch.zeros(2, 1, dtype=torch.long))
    assert not loop.covers(runner.cache, torch.zeros(2, 3, dtype=torch.long))
    model.train()  # attention dropout is the forward's to apply
    assert not loop.covers(runner.cache, torch.zeros(2, 1, dtype=torch.long))
    model.eval()
    from transformers import DynamicCache

    assert not loop.covers(DynamicCache(config=model.config), torch.zeros(2, 1, dtype=torch.long))


@pytest.mark.parametrize("bf16", [False, True])
def test_sampled_completions_match_the_forward(bf16, monkeypatch):
    """Whole rollouts (learnt layouts, rows dropped as they finish): the same tokens either way."""
    tok = make_tokenizer()
    model = make_model(tok, head_scale=3.0)
    # a third of the vocabulary stops a row: rows end at different steps and are dropped from the batch
    params = SamplingParams(max_new_tokens=12, temperature=1.0, format="bf16" if bf16 else "fp32",
                            stop_token_ids=list(range(2, len(tok), 3)))
    ids = encode(tok, PROMPTS)
    looped = Sampler(model, tok).generate(ids, 3, params, seed=4)
    monkeypatch.setattr(LayerLoop, "plan", classmethod(lambda cls, m: None))
    plain = Sampler(model, tok).generate(ids, 3, params, seed=4)
    assert torch.equal(looped.lengths, plain.lengths)
    assert looped.lengths.float().std() > 0  # rows ended at different steps
    assert torch.equal(looped.completion_ids, plain.completion_ids)
    torch.testing.assert_close(looped.sampling_logprobs, plain.sampling_logprobs, rtol=0, atol=0)


def test_a_bf16_rollout_reads_copies_and_leaves_the_fp32_weights():
    model = build("qwen2")
    before = model.model.layers[0].self_attn.q_proj.weight.detach().clone()

    def check(m):
        q = m.model.layers[0].self_attn.q_proj.weight
        assert q.dtype == torch.bfloat16 and torch.equal(q, before.to(torch.bfloat16))
        return decode(m, loop=True)

    with torch.inference_mode():
        got = run_with_bf16_weights(model, check)
        want = run_with_bf16_weights(model, lambda m: decode(m, loop=False))
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    q = model.model.layers[0].self_attn.q_proj.weight
    assert q.dtype == torch.float32 and torch.equal(q, before)
