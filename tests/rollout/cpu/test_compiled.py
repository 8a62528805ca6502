"""The compiled decode step: the eager layer loop's logits to the format's rounding, over steps whose rows and
cache length change, one graph for all of them (the weights of a later rollout included), in the layouts
the learner chose; eager where it does not apply."""

from __future__ import annotations

import re

import pytest
import torch

from grouprl.errors import ConfigError
from grouprl.rollout.cpu.compiled import CompiledStep, _decided_layout
from grouprl.rollout.cpu.layer_loop import LayerLoop
from grouprl.rollout.cpu.skinny import PACKED, PLAIN, TRANSPOSED, SkinnyProducts, Timings
from grouprl.rollout.engines import resolve_compile, resolve_engine
from grouprl.rollout.runner import Runner, left_pad, positions_from_mask, run_with_bf16_weights
from grouprl.rollout.sampler import Sampler
from grouprl.types import SamplingParams
from tests.helpers.rollout import PROMPTS, encode, make_model, make_tokenizer
from tests.rollout.cpu.test_layer_loop import build

PROMPT_ROWS = [[5, 6, 7, 8, 9], [10, 11, 3], [12, 13, 14], [15, 16, 17, 18]]
ROWS_KEPT = [None, None, [0, 2, 3], None, [1, 2], None, [1], None]
"""Before each decode step, the rows kept (None: all): 4 rows, then 3, 2 and 1."""


def decided(layout: int, calls: int = 4) -> Timings:
    """Timings after which the learner has chosen ``layout`` (the others measured slower)."""
    t = Timings(calls=[calls] * 3, seconds=[3.0] * 3)
    t.seconds[layout] = 1.0
    return t


def learnt(model: torch.nn.Module, layout: int) -> SkinnyProducts:
    """Products that have decided ``layout`` for every product shape of the decode steps here, both formats."""
    products = SkinnyProducts()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    shapes = {(m.out_features, m.in_features) for m in linears}
    shapes |= {(sum(m.out_features for m in parts), parts[0].in_features)
               for layer in model.model.layers for parts in ((layer.self_attn.q_proj, layer.self_attn.k_proj,
                                                              layer.self_attn.v_proj),
                                                             (layer.mlp.gate_proj, layer.mlp.up_proj))}
    for out, inp in shapes:
        for rows in (1, 2, 4, 8):
            for dtype in (torch.float32, torch.bfloat16):
                products.table[(out, inp, rows, dtype)] = decided(layout)
    return products


def steps(model: torch.nn.Module, products: SkinnyProducts, compiled: CompiledStep | None) -> list[torch.Tensor]:
    """Logits of a prefill of four left-padded rows and a decode step after each of :data:`ROWS_KEPT`."""
    ids, mask = left_pad(PROMPT_ROWS, 0, torch.device("cpu"))
    runner = Runner(model, ids.shape[1] + len(ROWS_KEPT) + 1, products, compiled)
    out = [runner.forward(ids, mask, positions_from_mask(mask))]
    tokens = torch.tensor([[20], [40], [60], [80]])
    for s, kept in enumerate(ROWS_KEPT):
        if kept is not None:
            rows = torch.tensor(kept)
            runner.select_rows(rows)
            mask, tokens = mask[rows], tokens[rows]
        mask = torch.cat([mask, torch.ones(len(mask), 1, dtype=mask.dtype)], 1)
        out.append(runner.forward(tokens + s, mask, positions_from_mask(mask)[:, -1:]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("family,extra,bf16,layout", [
    ("llama", {"tie_word_embeddings": True}, False, TRANSPOSED),
    ("qwen2", {}, True, PLAIN),
    ("qwen3", {"mlp_bias": False}, True, TRANSPOSED),
], ids=["llama-fp32-transposed", "qwen2-bf16-stacked-biases", "qwen3-bf16-head-norms"])
def test_compiled_steps_are_the_eager_loop_to_rounding(family, extra, bf16, layout):
    model = build(family, **extra)
    products = learnt(model, layout)
    compiled = CompiledStep()

    def both(m):
        want = steps(m, products, None)
        got = steps(m, products, compiled)
        return got, want

    with torch.inference_mode():
        runs = [run_with_bf16_weights(model, both) if bf16 else both(model) for _ in range(2)]  # two rollouts
    assert compiled.plan is not None and compiled.plan.stacked == bf16 and compiled.plan.layouts[0] == layout
    assert compiled.plan.head_norms == (family == "qwen3")
    # every step of 2 or more rows, in both rollouts, through the one graph: 6 a rollout (the 1-row ones eager)
    assert compiled.steps == 12 and compiled.refused == 0 and compiled.compile_seconds > 0
    assert compiled.metrics() == {"time/compile": compiled.compile_seconds}  # once, in the step that compiled
    assert compiled.metrics() == {"time/compile": 0.0}
    tolerance = 0.02 if bf16 else 1e-5  # bf16: about what the eager bf16 loop is from fp32 on these models
    for got, want in runs:
        for g, w in zip(got, want, strict=True):
            assert g.dtype == torch.float32 and g.shape == w.shape
            torch.testing.assert_close(g, w, rtol=0, atol=tolerance)
    assert not torch.allclose(runs[0][0][3], runs[0][0][4], atol=0.1)  # the steps see their new tokens


@pytest.mark.slow
def test_a_compiled_sampler_draws_what_the_eager_one_draws():
    """Whole rollouts in fp32 (rows dropped as they stop, layouts learnt on the way, then compiled): the same
    tokens, and log-probs to rounding."""
    tok = make_tokenizer()
    model = make_model(tok, head_scale=3.0)
    params = SamplingParams(max_new_tokens=16, temperature=1.0, stop_token_ids=list(range(2, len(tok), 5)))
    ids = encode(tok, PROMPTS)
    compiled = Sampler(model, tok, compile_steps=True)
    eager = Sampler(model, tok)
    for seed in range(6):  # the first rollouts learn the layouts, later ones run compiled
        got, want = compiled.generate(ids, 3, params, seed=seed), eager.generate(ids, 3, params, seed=seed)
        assert torch.equal(got.completion_ids, want.completion_ids)
        torch.testing.assert_close(got.sampling_logprobs, want.sampling_logprobs, rtol=0, atol=1e-4)
    assert compiled.compiled.steps > 0 and compiled.compiled.refused == 0


def test_until_the_layouts_are_learnt_and_for_lora_steps_run_eagerly():
    from peft import LoraConfig, get_peft_model

    model = build("llama")
    compiled = CompiledStep()
    with torch.inference_mode():
        steps(model, SkinnyProducts(), compiled)  # a fresh learner has decided nothing at first
    assert compiled.plan is None and compiled.unsupported is None and compiled.steps == 0
    assert compiled.fewest_rows == 2  # decode loops keep 2 rows for the graph to come
    lora = get_peft_model(build("llama"), LoraConfig(r=4, target_modules=["q_proj"]))
    compiled = CompiledStep()
    with torch.inference_mode(), pytest.warns(UserWarning, match="does not cover projections that are not plain"):
        steps(lora, learnt(lora.get_base_model(), PLAIN), compiled)
    assert compiled.plan is None and "LoRA" in compiled.unsupported and compiled.steps == 0
    assert compiled.fewest_rows == 1  # no graph will serve these steps: nothing to pad for
    assert compiled.metrics() == {"time/compile": 0.0}


def test_a_step_that_fails_to_compile_leaves_the_run_decoding_eagerly(monkeypatch):
    def failing(fn, **_):
        def call(*args):
            raise RuntimeError("no C++ toolchain for this")
        return call

    model = build("llama")
    products = learnt(model, PLAIN)
    compiled = CompiledStep()
    monkeypatch.setattr(torch, "compile", failing)
    with torch.inference_mode(), pytest.warns(UserWarning, match="failed to compile .*no C\\+\\+ toolchain"):
        got = steps(model, products, compiled)
    with torch.inference_mode():
        want = steps(model, products, None)
    assert compiled.steps == 0 and "failed to compile" in compiled.unsupported
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_a_packed_choice_becomes_the_faster_of_the_other_two():
    model = build("llama")
    loop = LayerLoop.plan(model)
    products = SkinnyProducts()
    head = loop.head
    key = (head.out_features, head.in_features, 4, torch.float32)
    assert _decided_layout(products, head, 3, torch.float32) is None
    products.table[key] = Timings(calls=[4, 4, 2], seconds=[3.0, 1.5, 0.1])
    assert _decided_layout(products, head, 3, torch.float32) is None  # packed has one timing: undecided
    products.table[key] = Timings(calls=[4, 4, 4], seconds=[3.0, 1.5, 0.3])
    assert products.table[key].layout() == PACKED
    assert _decided_layout(products, head, 3, torch.float32) == TRANSPOSED
    products.table[key] = Timings(calls=[4, 4, 4], seconds=[1.2, 1.5, 0.3])
    assert _decided_layout(products, head, 3, torch.float32) == PLAIN


def test_rollout_compile_asks_for_the_built_in_engine_on_a_cpu():
    model = build("llama")
    assert resolve_engine("auto", model, "sample", compile_steps=True) == (
        "hf", "the built-in engine's compiled decode steps (rollout_compile) outpace vLLM's CPU build")
    with pytest.raises(ConfigError, match="rollout_compile .* needs rollout_engine hf or auto"):
        resolve_compile(True, "vllm", "bf16", model, torch.device("cpu"))
    assert resolve_compile(None, "vllm", "bf16", model, torch.device("cpu"))[0] is False
    assert resolve_compile(None, "auto", "bf16", model, torch.device("cpu"))[0] is True
    with pytest.raises(ConfigError, match="rollout_compile .* needs rollout_engine hf or auto, and no GPU"):
        resolve_compile(True, "hf", "bf16", model, torch.device("cuda"))


def test_bf16_weights_rollouts_run_eagerly_on_the_built_in_engine():
    model = build("llama")
    assert resolve_compile(None, "hf", "bf16-weights", model, torch.device("cpu")) == (
        False, "bf16-weights rollouts run their decode steps eagerly")
    with pytest.raises(ConfigError, match="rollout_compile=true: bf16-weights rollouts run their decode steps eager"):
        resolve_compile(True, "auto", "bf16-weights", model, torch.device("cpu"))
    assert resolve_engine("auto", model, "sample", rollout_format="bf16-weights") == (
        "hf", "bf16-weights rollouts are the built-in engine's (vLLM samples in bf16 or fp32)")


def test_auto_compiles_bf16_rollouts_of_models_the_graph_covers(monkeypatch):
    from peft import LoraConfig, get_peft_model
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from grouprl.rollout.cpu import compiled as compiled_module
    from tests.rollout.cpu.test_layer_loop import SIZES

    cpu, llama = torch.device("cpu"), build("llama")
    assert resolve_compile(None, "hf", "bf16", llama, cpu)[0] is True
    assert resolve_compile(None, "hf", "fp32", llama, cpu) == (False, "fp32 rollouts: the matrix products outweigh "
                                                                     "what compiling fuses")
    assert resolve_compile(True, "hf", "fp32", llama, cpu) == (True, "rollout_compile=true")
    assert resolve_compile(False, "hf", "bf16", llama, cpu) == (False, "rollout_compile=false")
    assert resolve_compile(None, "vllm", "bf16", llama, cpu)[0] is False
    lora = get_peft_model(build("llama"), LoraConfig(r=4, target_modules=["q_proj"]))
    gemma = Gemma2ForCausalLM(Gemma2Config(**SIZES, head_dim=16))
    for model, why in ((lora, "LoRA"), (gemma, "outside the layer loop's families")):
        on, reason = resolve_compile(None, "hf", "bf16", model, cpu)
        assert not on and why in reason
        with pytest.raises(ConfigError, match=f"rollout_compile=true: the compiled decode step cannot serve .*{why}"):
            resolve_compile(True, "hf", "bf16", model, cpu)
    monkeypatch.setattr(compiled_module, "compiler_found", lambda: False)
    why = "no C++ compiler found (inductor's CPU code needs g++ or clang++)"
    assert resolve_compile(None, "hf", "bf16", llama, cpu) == (False, why)
    with pytest.raises(ConfigError, match=re.escape(f"rollout_compile=true: {why}")):
        resolve_compile(True, "hf", "bf16", llama, cpu)


@pytest.mark.slow
def test_a_training_run_compiles_once_and_trains(tmp_path):
    from tests.helpers.trainer import make_trainer, params_of

    trainer = make_trainer(tmp_path, rollout_compile=True, total_steps=6, max_new_tokens=10, eval_every=0)
    before = params_of(trainer.policy)
    trainer.train()
    records = [r for r in trainer.metrics_log.records() if "time/compile" in r]
    compiled = trainer.sampler.compiled
    assert len(records) == 6 and [r["time/compile"] > 0 for r in records].count(True) == 1
    assert compiled.steps > 0 and compiled.refused == 0
    after = params_of(trainer.policy)
    assert any(not torch.equal(before[k], after[k]) for k in before)
