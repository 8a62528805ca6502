"""The vLLM rollout engine. Its translation layers (sampling settings in, outputs to a
RolloutBatch, LoRA weight names) are tested here on any machine; the engine itself only where a
CUDA GPU and the vllm package exist."""

import importlib.util
import time
from types import SimpleNamespace

import pytest
import torch

from grouprl.models import LoraSettings, apply_lora, tiny_causal_lm
from grouprl.rollout.sampler import Sampler
from grouprl.rollout.vllm import VLLMSampler, base_weight_name, outputs_to_batch, vllm_sampling_kwargs
from grouprl.trainer.config import GRPOConfig
from grouprl.types import SamplingParams

HAVE_ENGINE = torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None
needs_engine = pytest.mark.skipif(not HAVE_ENGINE, reason="needs a CUDA GPU and the vllm package")


@pytest.mark.skipif(HAVE_ENGINE, reason="this machine can run vLLM")
def test_without_a_gpu_or_vllm_the_engine_says_what_is_missing():
    model, tok = tiny_causal_lm()
    with pytest.raises(RuntimeError, match="CUDA GPU|vllm package") as err:
        VLLMSampler(model, tok, max_model_len=64)
    assert "rollout_engine=hf" in str(err.value)


def test_config_refuses_vllm_beam_groups_and_unknown_correction_levels():
    with pytest.raises(ValueError, match="rollout_mode=beam needs rollout_engine=hf"):
        GRPOConfig(rollout_engine="vllm", rollout_mode="beam")
    with pytest.raises(ValueError, match="rollout_is='tok' is not one of: auto, none, sequence, token"):
        GRPOConfig(rollout_is="tok")
    with pytest.raises(ValueError, match="vllm_gpu_memory_utilization"):
        GRPOConfig(vllm_gpu_memory_utilization=1.5)


def test_sampling_settings_map_one_to_one():
    params = SamplingParams(max_new_tokens=12, temperature=0.7, top_k=0, top_p=0.9, min_p=0.05,
                            repetition_penalty=1.1, stop_strings=("\n\n",), stop_token_ids=(5,))
    kw = vllm_sampling_kwargs(params, 4, [2, 5], seed=11)
    assert kw == {"n": 4, "temperature": 0.7, "top_p": 0.9, "top_k": -1, "min_p": 0.05, "repetition_penalty": 1.1,
                  "max_tokens": 12, "stop_token_ids": [2, 5], "stop": ["\n\n"], "include_stop_str_in_output": True,
                  "logprobs": 0, "seed": 11}
    assert vllm_sampling_kwargs(SamplingParams(top_k=20), 2, [], None)["top_k"] == 20
    with pytest.raises(ValueError, match="sampled groups only"):
        vllm_sampling_kwargs(SamplingParams(mode="beam"), 2, [], None)


def _as_vllm_outputs(batch, group_size):
    """What vLLM would return for the completions in ``batch``: RequestOutputs of CompletionOutputs."""
    outputs = []
    for p in range(batch.num_prompts):
        completions = []
        for i in range(p * group_size, (p + 1) * group_size):
            n = int(batch.lengths[i])
            ids = batch.completion_ids[i, :n].tolist()
            logprobs = [{t: SimpleNamespace(logprob=float(lp))} for t, lp in zip(ids, batch.sampling_logprobs[i, :n])]
            completions.append(SimpleNamespace(token_ids=ids, logprobs=logprobs,
                                               finish_reason="length" if batch.truncated[i] else "stop"))
        outputs.append(SimpleNamespace(outputs=completions))
    return outputs


def test_vllm_outputs_become_the_batch_the_builtin_sampler_makes():
    model, tok = tiny_causal_lm(seed=1)
    sampler = Sampler(model, tok)
    prompt_ids = sampler.encode(["Count: 1, 2,", "Say hi"])
    params = SamplingParams(max_new_tokens=10, stop_strings=("a",))
    want = sampler.generate(prompt_ids, 3, params, seed=4, extras={"target": ["3", "x"]})
    got = outputs_to_batch(_as_vllm_outputs(want, 3), prompt_ids, 3, tok, sampler.pad_token_id, ("a",),
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


@needs_engine
def test_vllm_engine_follows_the_trainer_weights_and_agrees_with_its_log_probs():
    from grouprl.algos.rollout_correction import rollout_mismatch
    from grouprl.rollout.logprobs import token_logprobs

    model, tok = tiny_causal_lm(seed=0, hidden_size=128, num_heads=2, num_kv_heads=2)
    model = model.cuda()
    engine = VLLMSampler(model, tok, max_model_len=96, gpu_memory_utilization=0.2, sleep=True)
    prompt_ids = Sampler(model, tok).encode([f"Count: {i}" for i in range(16)])
    params = SamplingParams(max_new_tokens=32)
    batch = engine.generate(prompt_ids, 8, params, seed=0)
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                 batch.completion_mask)
    kl = float(rollout_mismatch(logp, batch.sampling_logprobs, batch.completion_mask)["rollout/mismatch_kl"])
    assert kl < 1e-2  # bf16 engine vs fp32 trainer: small, not zero
    with torch.no_grad():  # an optimizer step would mark the weights stale; do it by hand
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    engine.mark_stale()
    after = engine.generate(prompt_ids, 8, params, seed=0)
    with torch.no_grad():
        logp, _ = token_logprobs(model, after.prompt_ids, after.prompt_mask, after.completion_ids,
                                 after.completion_mask)
    assert float(rollout_mismatch(logp, after.sampling_logprobs, after.completion_mask)["rollout/mismatch_kl"]) < 1e-2
    times = {}
    for name, s in (("vllm", engine), ("hf", Sampler(model, tok))):
        start = time.perf_counter()
        out = s.generate(prompt_ids, 8, params, seed=1)
        times[name] = float(out.completion_mask.sum()) / (time.perf_counter() - start)
    print(f"tokens/s: vllm {times['vllm']:.0f}, built-in {times['hf']:.0f}")
