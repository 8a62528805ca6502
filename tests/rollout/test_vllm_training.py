"""Training through the vLLM engine, run for real when the package is installed: every algorithm, an exact
resume, agents' conversations against the KV-cache engine's."""

from __future__ import annotations

import pytest
import torch

from grouprl.types import SamplingParams
from tests.helpers.vllm import model_and_tok, needs_vllm


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
