"""The compiled decode step: the eager layer loop's logits to the format's rounding, over steps whose rows and
cache length change, one graph for all of them (the weights of a later rollout included); eager where it does
not apply."""

from __future__ import annotations

import re

import pytest
import torch

from grouprl.errors import ConfigError
from grouprl.rollout.cpu.compiled import CompiledStep
from grouprl.rollout.engines import COMPILE_PAYS_FROM_STEPS, resolve_compile, resolve_engine
from grouprl.rollout.runner import Runner, left_pad, positions_from_mask, run_with_bf16_weights
from grouprl.rollout.sampler import Sampler
from grouprl.types import SamplingParams
from tests.helpers.rollout import PROMPTS, encode, make_model, make_tokenizer
from tests.rollout.cpu.test_layer_loop import build

PROMPT_ROWS = [[5, 6, 7, 8, 9], [10, 11, 3], [12, 13, 14], [15, 16, 17, 18]]
ROWS_KEPT = [None, None, [0, 2, 3], None, [1, 2], None, [1], None]
"""Before each decode step, the rows kept (None: all): 4 rows, then 3, 2 and 1."""


def steps(model: torch.nn.Module, compiled: CompiledStep | None) -> list[torch.Tensor]:
    """Logits of a prefill of four left-padded rows and a decode step after each of :data:`ROWS_KEPT`."""
    ids, mask = left_pad(PROMPT_ROWS, 0, torch.device("cpu"))
    runner = Runner(model, ids.shape[1] + len(ROWS_KEPT) + 1, compiled)
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
@pytest.mark.parametrize("family,extra,bf16", [
    ("llama", {"tie_word_embeddings": True}, False),
    ("qwen2", {}, True),
    ("qwen3", {"mlp_bias": False}, True),
], ids=["llama-fp32-tied-head", "qwen2-bf16-biases", "qwen3-bf16-head-norms"])
def test_compiled_steps_are_the_eager_loop_to_rounding(family, extra, bf16):
    model = build(family, **extra)
    compiled = CompiledStep()

    def both(m):
        want = steps(m, None)
        got = steps(m, compiled)
        return got, want

    with torch.inference_mode():
        runs = [run_with_bf16_weights(model, both) if bf16 else both(model) for _ in range(2)]  # two rollouts
    assert compiled.plan is not None and compiled.plan.head_norms == (family == "qwen3")
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
    """Whole rollouts in fp32 (rows dropped as they stop, compiled at the first step it can take): the same
    tokens, and log-probs to rounding."""
    tok = make_tokenizer()
    model = make_model(tok, head_scale=3.0)
    params = SamplingParams(max_new_tokens=16, temperature=1.0, stop_token_ids=list(range(2, len(tok), 5)))
    ids = encode(tok, PROMPTS)
    compiled = Sampler(model, tok, compile_steps=True)
    eager = Sampler(model, tok)
    for seed in range(3):
        got, want = compiled.generate(ids, 3, params, seed=seed), eager.generate(ids, 3, params, seed=seed)
        assert torch.equal(got.completion_ids, want.completion_ids)
        torch.testing.assert_close(got.sampling_logprobs, want.sampling_logprobs, rtol=0, atol=1e-4)
    assert compiled.compiled.steps > 0 and compiled.compiled.refused == 0


def test_a_step_compiles_at_its_first_chance_and_lora_steps_run_eagerly():
    from peft import LoraConfig, get_peft_model

    compiled = CompiledStep()
    assert compiled.plan is None and compiled.fewest_rows == 2  # decode loops keep 2 rows for the graph to come
    lora = get_peft_model(build("llama"), LoraConfig(r=4, target_modules=["q_proj"]))
    with torch.inference_mode(), pytest.warns(UserWarning, match="does not cover projections that are not plain"):
        steps(lora, compiled)
    assert compiled.plan is None and "LoRA" in compiled.unsupported and compiled.steps == 0
    assert compiled.fewest_rows == 1  # no graph will serve these steps: nothing to pad for
    assert compiled.metrics() == {"time/compile": 0.0}


def test_a_step_that_fails_to_compile_leaves_the_run_decoding_eagerly(monkeypatch):
    def failing(fn, **_):
        def call(*args):
            raise RuntimeError("no C++ toolchain for this")
        return call

    model = build("llama")
    compiled = CompiledStep()
    monkeypatch.setattr(torch, "compile", failing)
    with torch.inference_mode(), pytest.warns(UserWarning, match="failed to compile .*no C\\+\\+ toolchain"):
        got = steps(model, compiled)
    with torch.inference_mode():
        want = steps(model, None)
    assert compiled.steps == 0 and "failed to compile" in compiled.unsupported
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_rollout_compile_asks_for_the_built_in_engine_on_a_cpu():
    model = build("llama")
    assert resolve_engine("auto", model, "sample", compile_steps=True) == (
        "hf", "the built-in engine's compiled decode steps (rollout_compile) outpace vLLM's CPU build")
    with pytest.raises(ConfigError, match="rollout_compile .* needs rollout_engine hf or auto"):
        resolve_compile(True, "vllm", "bf16", model, torch.device("cpu"))
    assert resolve_compile(None, "vllm", "bf16", model, torch.device("cpu"))[0] is False
    assert resolve_compile(None, "auto", "bf16", model, torch.device("cpu"))[0] is True
    assert resolve_compile(True, "auto", "bf16", model, torch.device("cpu"))[0] is True
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
    assert resolve_compile(None, "hf", "bf16", llama, cpu) == (True, "bf16 rollouts on a CPU: compiling fuses "
                                                                    "the small operators around the products")
    assert resolve_compile(True, "hf", "bf16", llama, cpu) == (True, "rollout_compile=true")
    assert resolve_compile(None, "hf", "fp32", llama, cpu) == (False, "fp32 rollouts: the matrix products outweigh "
                                                                     "what compiling fuses")
    assert resolve_compile(True, "hf", "fp32", llama, cpu) == (True, "rollout_compile=true")
    assert resolve_compile(False, "hf", "bf16", llama, cpu) == (False, "rollout_compile=false")
    assert resolve_compile(None, "vllm", "bf16", llama, cpu)[0] is False
    # a run too short to repay compiling stays eager unless asked; the boundary is the constant's
    short = COMPILE_PAYS_FROM_STEPS - 1
    assert resolve_compile(None, "hf", "bf16", llama, cpu, steps=short) == (
        False, f"a {short}-step run: compiling the decode steps (minutes of a CPU the first time) pays back "
               f"from about {COMPILE_PAYS_FROM_STEPS} steps")
    assert resolve_compile(None, "hf", "bf16", llama, cpu, steps=COMPILE_PAYS_FROM_STEPS)[0] is True
    assert resolve_compile(True, "hf", "bf16", llama, cpu, steps=2) == (True, "rollout_compile=true")
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
