"""The rollout plan: what serves the rollouts and why, decided once at start, recorded where a run keeps its
setup (summary.json, checkpoints), and the one place the engine is built from."""

import json
from dataclasses import replace

import pytest
import torch

from grouprl.models import tiny_causal_lm
from grouprl.models.precision import pinned, resolve_formats
from grouprl.rollout.sampler import Sampler
from grouprl.trainer import rollout_plan
from grouprl.trainer.rollout_plan import ENGINES, build_rollout, plan_rollout
from grouprl.trainer.trainer import with_values
from tests.helpers.trainer import base_config, make_trainer


def _plan(config, policy, sampler=None, multi_turn=False, steps=None):
    formats = resolve_formats(config.dtype, config.ref_dtype, config.rollout_dtype)
    return plan_rollout(with_values(config, pinned(formats)), formats, policy, torch.device("cpu"),
                        multi_turn=multi_turn, sampler=sampler, steps=steps)


def test_fp32_rollouts_on_the_built_in_engine_need_no_correction(tmp_path):
    model, _ = tiny_causal_lm()
    plan = _plan(base_config(tmp_path, rollout_engine="hf"), model)
    assert (plan.engine, plan.engine_reason) == ("hf", "rollout_engine=hf")
    assert plan.rollout_format == "fp32" and not plan.own_weights and plan.rollout_is == "none"
    assert plan.compile is False and plan.compile_reason.startswith("fp32 rollouts")
    assert plan.formats.startswith("rollouts fp32, training fp32, reference fp32")
    # every other pairing is corrected for: bf16 rollouts beside fp32 training, bf16 training
    assert _plan(base_config(tmp_path, rollout_engine="hf", rollout_dtype="bf16"), model).rollout_is == "token"
    assert _plan(base_config(tmp_path, rollout_engine="hf", dtype="bf16"), model).rollout_is == "token"
    assert _plan(base_config(tmp_path, rollout_engine="hf", rollout_is="sequence"), model).rollout_is == "sequence"


def test_the_run_length_decides_whether_bf16_rollouts_compile(tmp_path, monkeypatch):
    """The plan hands the run's total_steps to the compile rule: a short bf16 run stays eager, and auto then
    takes the engine it would take without compiling (here the built-in one: vLLM is made absent)."""
    from grouprl.rollout import engines
    from grouprl.rollout.cpu import compiled
    from grouprl.rollout.engines import COMPILE_PAYS_FROM_STEPS

    monkeypatch.setattr(engines, "vllm_installed", lambda: False)
    monkeypatch.setattr(compiled, "compiler_found", lambda: True)  # the rule, not this machine's toolchain
    model, _ = tiny_causal_lm()
    short = _plan(base_config(tmp_path, rollout_dtype="bf16", total_steps=12), model)
    assert not short.compile and short.compile_reason.startswith("a 12-step run: compiling")
    assert short.engine == "hf" and short.engine_reason.startswith("vllm is not installed")
    long = _plan(base_config(tmp_path, rollout_dtype="bf16", total_steps=COMPILE_PAYS_FROM_STEPS), model)
    assert long.compile and long.compile_reason.startswith("bf16 rollouts on a CPU")
    assert long.engine == "hf" and long.engine_reason.startswith("the built-in engine's compiled decode steps")
    # grouprl eval: one pass over the held-out prompts, whatever total_steps the config says
    once = _plan(base_config(tmp_path, rollout_dtype="bf16", total_steps=COMPILE_PAYS_FROM_STEPS), model, steps=1)
    assert not once.compile and once.compile_reason.startswith("a 1-step run")


def test_a_passed_sampler_is_named_and_kept(tmp_path):
    model, tok = tiny_causal_lm()
    given = Sampler(model, tok)
    plan = _plan(base_config(tmp_path), model, sampler=given)
    assert plan.engine == "Sampler" and plan.engine_reason == "a Sampler was passed in"
    assert not plan.own_weights and plan.rollout_is == "none" and plan.compile is False

    class OwnCopy:
        uses_live_model, compiles = False, False

    own = _plan(base_config(tmp_path), model, sampler=OwnCopy())
    assert own.own_weights and own.rollout_is == "token"  # its numbers are not the trainer's
    assert build_rollout(base_config(tmp_path), plan, model, tok, longest=64, sampler=given) is given


def test_rollout_servers_pick_the_server_engine(tmp_path, monkeypatch):
    model, tok = tiny_causal_lm()
    config = with_values(base_config(tmp_path, rollout_engine="hf"), {"rollout_servers": ("a:1", "b:2")})
    plan = _plan(config, model)
    assert (plan.engine, plan.engine_reason) == ("servers", "rollout_servers=a:1,b:2")
    assert plan.own_weights and plan.rollout_is == "token" and not plan.compile
    from grouprl.trainer import rollout_servers

    calls = []
    monkeypatch.setattr(rollout_servers, "server_sampler", lambda *args, **kw: calls.append((args, kw)) or "client")
    assert build_rollout(config, plan, model, tok, longest=99) == "client"
    args, kw = calls[0]
    assert args[2] is tok and args[3] == 99  # sized for the longest sequence
    assert kw == {"transport": "files"}  # the plan's: auto on a CPU policy
    assert plan.setup()["rollout_weights_transport"] == "files (auto: the policy is on cpu, not a CUDA device)"


def test_each_engine_builds_what_it_names(tmp_path, monkeypatch):
    model, tok = tiny_causal_lm()
    config = base_config(tmp_path, rollout_engine="hf")
    plan = _plan(config, model)
    built = build_rollout(config, plan, model, tok, longest=64)
    assert isinstance(built, Sampler) and built.model is model and built.compiled is None
    assert build_rollout(config, plan, model, tok, longest=64, multi_turn=True) is None  # the agent decodes itself
    seen = []
    monkeypatch.setattr(rollout_plan, "vllm_engine", lambda c, p, t, n: seen.append(n) or "vllm")
    assert build_rollout(config, replace(plan, engine="vllm"), model, tok, longest=77) == "vllm" and seen == [77]
    with pytest.raises(ValueError, match="rollout engine.*hf"):
        ENGINES.get("hff")


def test_the_trainer_records_its_plan(tmp_path):
    trainer = make_trainer(tmp_path, rollout_engine="hf", save_every=1, total_steps=1, eval_every=0)
    plan = trainer.rollout_plan
    assert trainer.setup["rollout_engine"] == "hf (rollout_engine=hf)"
    assert trainer.setup["rollout_compile"] == f"off ({plan.compile_reason})"
    assert trainer.setup["rollout_is"] == "none" == trainer.config.rollout_is
    assert not hasattr(trainer.config, "resolved_engine") and not hasattr(trainer.config, "compile_steps")
    trainer.train()
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["setup"]["rollout_engine"] == trainer.setup["rollout_engine"]
    state = json.loads(next((run / "checkpoints").glob("*/state.json")).read_text())
    assert state["rollout"] == plan.as_dict()
