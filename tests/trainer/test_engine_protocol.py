"""The trainer reaches its rollout engine through the declared protocol alone (grouprl.rollout.protocol): real runs
through an engine wrapped so that any other name it is asked for is refused and recorded, and a scan of the
trainer's source for attributes of the names an engine goes by."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
import torch

from grouprl.rollout.protocol import AHEAD_MEMBERS, ENGINE_MEMBERS, RolloutEngine, SamplesAhead
from grouprl.rollout.sampler import Sampler
from grouprl.trainer.trainer import Trainer
from tests.helpers.trainer import PROMPTS, base_config, digit_share

TRAINER = Path(__file__).resolve().parents[2] / "src" / "grouprl" / "trainer"
ENGINE_NAMES = {"sampler": ENGINE_MEMBERS, "engine": ENGINE_MEMBERS, "handover": AHEAD_MEMBERS}
"""The names the trainer's modules give an engine (or its hand-over), and what each may be asked."""
needs_vllm_cpu = pytest.mark.skipif(importlib.util.find_spec("vllm") is None or torch.cuda.is_available(),
                                    reason="needs vLLM's CPU build (the test extra installs vllm-cpu)")


class Strict:
    """``inner`` as the trainer may see it: the ``allowed`` names pass through; any other is refused (an
    AttributeError) and recorded in ``refused``, so a probe that swallows the error is still seen."""

    def __init__(self, inner, allowed, refused: list[str]):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_allowed", allowed)
        object.__setattr__(self, "_refused", refused)

    def __getattr__(self, name):
        if name not in self._allowed:
            self._refused.append(name)
            raise AttributeError(f"{name!r} is not declared by the engine protocol")
        value = getattr(self._inner, name)
        if name == "sample_ahead":  # what it returns is held to SamplesAhead
            return lambda: (lambda got: None if got is None else Strict(got, AHEAD_MEMBERS, self._refused))(value())
        return value

    def __setattr__(self, name, value):
        self._refused.append(f"{name} (set)")
        raise AttributeError(f"the trainer set {name!r} on the engine")


def train_through(engine, model, tok, tmp_path, **overrides) -> tuple[Trainer, list[str]]:
    """Two steps, each evaluated, of ``model`` through ``engine`` held to the protocol; (trainer, names refused)."""
    refused: list[str] = []
    config = base_config(tmp_path, total_steps=2, eval_every=1, **overrides)
    trainer = Trainer(config, policy=model, tokenizer=tok, reward_fns=[digit_share],
                      train_data=PROMPTS, eval_data=PROMPTS[:2], sampler=Strict(engine, ENGINE_MEMBERS, refused))
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer, refused


def test_every_engine_implements_the_protocol():
    from grouprl.rollout.agent import AgentSampler
    from grouprl.rollout.vllm import VLLMSampler
    from grouprl.serve.client.handover import WeightHandover
    from grouprl.serve.client.server_sampler import ServerSampler

    for engine in (Sampler, VLLMSampler, ServerSampler, AgentSampler):
        missing = sorted(name for name in ENGINE_MEMBERS if not hasattr(engine, name))
        assert not missing, (engine.__name__, missing)
    handover = WeightHandover(torch.nn.Linear(2, 2), None, "files", ranks=None, dtype=torch.float32, lora=False,
                              timeout=1.0, weights_dir=None, sender=object())
    assert isinstance(handover, SamplesAhead)
    assert "sample_ahead" in ENGINE_MEMBERS and "version" in AHEAD_MEMBERS and "engine" not in ENGINE_MEMBERS


def test_a_run_through_the_built_in_engine_asks_only_what_the_protocol_declares(tmp_path):
    from grouprl.models import tiny_causal_lm

    model, tok = tiny_causal_lm()
    engine = Sampler(model, tok)
    assert isinstance(engine, RolloutEngine) and not isinstance(engine, SamplesAhead)
    trainer, refused = train_through(engine, model, tok, tmp_path)
    assert refused == []
    records = [r for r in trainer.metrics_log.records() if "reward/mean" in r]
    assert [r["step"] for r in records] == [1, 2] and "eval/len_mean" in trainer.eval_history[-1]
    # the proxy does refuse a probe the trainer might make: the test fails if one comes back
    with pytest.raises(AttributeError, match="'ranks' is not declared"):
        getattr(Strict(engine, ENGINE_MEMBERS, refused), "ranks")  # noqa: B009 - the probe itself
    assert refused == ["ranks"]


def test_an_agent_run_asks_its_multi_turn_sampler_only_what_the_protocol_declares(tmp_path):
    from grouprl.envs import make_env_factory
    from grouprl.models import tiny_causal_lm
    from grouprl.rollout.agent import AgentSampler, ChatRenderer
    from grouprl.rollout.turns import TurnLimits
    from grouprl.trainer.inputs import RunInputs

    torch.manual_seed(0)
    model, tok = tiny_causal_lm(seed=0, max_positions=512)
    agent = AgentSampler(model, tok, ChatRenderer(tok), TurnLimits(4, 3, 64))
    assert isinstance(agent, RolloutEngine) and agent.sample_ahead() is None
    refused: list[str] = []
    inputs = RunInputs(train_rows=[{"seed": i} for i in range(8)], reward_fns=[], reward_weights=[],
                       eval_rows=[{"seed": 100 + i} for i in range(2)],
                       env=make_env_factory("tests.helpers.agents:DigitTalk", None))
    config = base_config(tmp_path, max_new_tokens=4, max_turns=3, max_trajectory_tokens=64, total_steps=2, eval_every=1)
    strict = Strict(agent, ENGINE_MEMBERS, refused)
    trainer = Trainer(config, policy=model, tokenizer=tok, inputs=inputs, sampler=strict)
    try:
        trainer.train()
    finally:
        trainer.close()
    assert refused == []
    assert [r["step"] for r in trainer.metrics_log.records() if "env/return_mean" in r] == [1, 2]


@pytest.mark.slow
@needs_vllm_cpu
def test_a_run_through_in_process_vllm_asks_only_what_the_protocol_declares(tmp_path):
    from grouprl.rollout.vllm import VLLMSampler
    from tests.helpers.vllm import model_and_tok

    model, tok = model_and_tok(seed=6)
    engine = VLLMSampler(model, tok, max_model_len=256)
    _, refused = train_through(engine, model, tok, tmp_path)
    assert refused == []


@pytest.mark.slow
@needs_vllm_cpu
def test_a_run_sampling_ahead_from_a_server_asks_only_what_the_protocol_declares(tmp_path):
    from grouprl.models import tiny_causal_lm
    from grouprl.serve.client.server_sampler import ServerSampler
    from tests.helpers.servers import TINY64, started

    with started(tmp_path / "server", 1, max_rows=32) as info:
        model, tok = tiny_causal_lm(seed=5, **TINY64)
        engine = ServerSampler(model, tok, info["addresses"], timeout=120.0)
        trainer, refused = train_through(engine, model, tok, tmp_path, rollout_servers=tuple(info["addresses"]),
                                         max_staleness=1, rollout_is="token")
    assert refused == []
    records = [r for r in trainer.metrics_log.records() if "reward/mean" in r]
    assert [r["step"] for r in records] == [1, 2] and "async/staleness" in records[0]


def engine_attributes(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, engine name, attribute) of every attribute taken of a name an engine goes by (``sampler.x``,
    ``self.sampler.x``) and every ``getattr``/``hasattr``/``setattr`` on one."""
    def engine_name(node: ast.AST) -> str | None:
        if isinstance(node, ast.Name) and node.id in ENGINE_NAMES:
            return node.id
        if isinstance(node, ast.Attribute) and node.attr in ENGINE_NAMES:
            return node.attr
        return None

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (name := engine_name(node.value)) is not None:
            found.append((node.lineno, name, node.attr))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and node.args
              and (name := engine_name(node.args[0])) is not None):
            found.append((node.lineno, name, f"{node.func.id}()"))
    return found


def test_the_trainers_source_asks_an_engine_only_declared_members():
    undeclared = [f"{path.relative_to(TRAINER)}:{line} {name}.{attr}"
                  for path in sorted(TRAINER.rglob("*.py"))
                  for line, name, attr in engine_attributes(ast.parse(path.read_text()))
                  if attr not in ENGINE_NAMES[name]]
    assert undeclared == []
    asked = {attr for path in TRAINER.rglob("*.py") for _, _, attr in engine_attributes(ast.parse(path.read_text()))}
    assert {"generate", "update_weights", "rest", "metrics", "close", "sample_ahead", "sync_weights"} <= asked
    # the scan sees a probe, a setting from outside and an undeclared attribute
    probe = ast.parse("getattr(self.sampler, 'rest', None)\nengine.sampling_ahead = True\nsampler.ranks.group")
    assert [attr for _, _, attr in engine_attributes(probe)] == ["getattr()", "sampling_ahead", "ranks"]
