"""What a rollout server checks of a weight push before vLLM is touched (grouprl.serve.server.pushes), and its weights
route in order (grouprl.serve.server.routes) on a stand-in engine: where from, which version, what is in the folder, and
what happens when a reload fails anyway. No vLLM."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from grouprl.models import LoraSettings, apply_lora, tiny_causal_lm
from grouprl.serve.server.pushes import (
    PushRefused,
    check_adapter,
    check_full,
    read_header,
    version_refusal,
    within_root,
)
from grouprl.serve.server.routes import ServerState, router
from grouprl.serve.weights.transport import WEIGHTS_FILE, reading, write_model_folder, write_weights_file


def served_folder(root: Path, **shape) -> Path:
    model, tok = tiny_causal_lm(seed=0, **shape)
    write_model_folder(model, tok, root, reading(model))
    return root


def pushed(root: Path, version: int, lora_rank: int | None = None, **shape) -> Path:
    """``root/v<version>`` as a trainer's push writes it: full weights (write_weights_file), or a peft adapter of
    ``lora_rank`` (its adapter entries, peft's layout)."""
    model, _ = tiny_causal_lm(seed=version, **shape)
    folder = root / f"v{version}"
    if lora_rank is None:
        write_weights_file(model, reading(model), folder)
        return folder
    peft = apply_lora(model, LoraSettings(rank=lora_rank))
    peft.save_pretrained(str(folder), state_dict={n: t for n, t in peft.state_dict().items() if ".lora_" in n})
    return folder


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict:
    return read_header(served_folder(tmp_path_factory.mktemp("engine")) / WEIGHTS_FILE)


# -- where a push comes from ---------------------------------------------------------------------------------
def test_a_folder_outside_the_weights_root_is_a_403_after_symlinks_and_dots_are_resolved(tmp_path):
    root, elsewhere = tmp_path / "weights", tmp_path / "elsewhere"
    (root / "v1").mkdir(parents=True)
    elsewhere.mkdir()
    (root / "link").symlink_to(elsewhere)
    assert within_root(str(root / "v1"), root) == (root / "v1").resolve()
    for path in (elsewhere, root / ".." / "elsewhere", root / "link", Path("/etc")):
        with pytest.raises(PushRefused, match=f"outside this server's weights root {root}") as refused:
            within_root(str(path), root)
        assert refused.value.status == 403
    with pytest.raises(PushRefused, match="takes no folder pushes: start it with --weights_root"):
        within_root(str(root / "v1"), None)


# -- which version -------------------------------------------------------------------------------------------
def test_versions_only_move_forward_unless_the_trainer_resumes_a_run():
    assert version_refusal(None, 0, False) is None  # a server's own weights: any first push
    assert version_refusal(7, 8, False) is None
    assert version_refusal(7, 3, True) is None
    assert version_refusal(7, 7, False, equal_ok=True) is None  # a first adapter on its base weights
    said = version_refusal(7, 3, False)
    assert said == ("the push of policy version 3 is not newer than the weights version 7 this server holds: "
                    "versions only move forward (a trainer that restarts a run says so with resume)")
    assert "version 7 is not newer" in version_refusal(7, 7, False)


# -- what is in the folder -----------------------------------------------------------------------------------
def test_the_trainers_own_full_push_passes_and_other_weights_are_named(tmp_path, served):
    check_full(pushed(tmp_path / "a", 1), served)
    with pytest.raises(PushRefused, match=r"has other shapes than the served model: lm_head.weight \[.*\] \(served"):
        check_full(pushed(tmp_path / "b", 1, hidden_size=32, num_heads=2), served)
    with pytest.raises(PushRefused, match=r"not the served model's weights: not in the served model: model.layers.2"):
        check_full(pushed(tmp_path / "c", 1, num_layers=3), served)
    with pytest.raises(PushRefused, match=r"not the served model's weights: missing model.layers.1.* and \d+ more$"):
        check_full(pushed(tmp_path / "d", 1, num_layers=1), served)
    with pytest.raises(PushRefused, match="holds no model.safetensors") as refused:
        check_full(Path("/etc"), served)
    assert refused.value.status == 422


def test_a_weights_file_cut_short_or_not_safetensors_is_refused(tmp_path, served):
    folder = pushed(tmp_path, 1)
    file = folder / WEIGHTS_FILE
    whole = file.read_bytes()
    file.write_bytes(whole[:-10])
    with pytest.raises(PushRefused, match="is not a whole safetensors file .*file not fully covered") as refused:
        check_full(folder, served)
    assert refused.value.status == 422
    for junk, said in [(b"abc", "header too small"), ((10**9).to_bytes(8, "little"), "header too large"),
                       ((4).to_bytes(8, "little") + b"}{!!", "invalid JSON in header")]:
        file.write_bytes(junk)
        with pytest.raises(PushRefused, match=said):
            check_full(folder, served)
    file.write_bytes(whole)
    os.chmod(file, 0)
    if not os.access(file, os.R_OK):  # root reads anything
        with pytest.raises(PushRefused, match="cannot be read"):
            check_full(folder, served)


def test_an_adapter_is_checked_for_its_rank_and_the_weights_it_adapts(tmp_path, served):
    check_adapter(pushed(tmp_path / "a", 1, lora_rank=4), served, max_rank=4)
    with pytest.raises(PushRefused, match="the adapter's rank 8 is over this server's lora_rank 4"):
        check_adapter(pushed(tmp_path / "b", 1, lora_rank=8), served, max_rank=4)
    with pytest.raises(PushRefused, match="started without --lora_rank") as refused:
        check_adapter(pushed(tmp_path / "c", 1, lora_rank=4), served, max_rank=None)
    assert refused.value.status == 400
    wide = pushed(tmp_path / "d", 1, lora_rank=4, hidden_size=32, num_heads=2)
    with pytest.raises(PushRefused, match=r"down_proj.lora_A.weight is \[4, 64\]; rank 4 on "
                                          r"model.layers.0.mlp.down_proj.weight \[64, 128\] needs \[4, 128\]"):
        check_adapter(wide, served, max_rank=4)
    with pytest.raises(PushRefused, match="no readable adapter_config.json"):
        check_adapter(pushed(tmp_path / "e", 1), served, max_rank=4)


# -- the route, in order -------------------------------------------------------------------------------------
class Engine:
    """vLLM's engine client as the weights route calls it; a reload of a path in ``failing`` raises."""

    def __init__(self, failing: tuple[Path, ...] = ()):
        self.calls: list[str] = []
        self.failing = {str(p) for p in failing}

    def __getattr__(self, name):
        async def call(*args, **kwargs):
            path = (kwargs.get("kwargs") or {}).get("weights_path")
            self.calls.append(f"{name}({path or (args[0] if args else '')})")
            if path in self.failing:
                raise RuntimeError("shapes moved mid-reload")
        return call


def server(tmp_path: Path, served: dict, engine: Engine) -> tuple[TestClient, ServerState]:
    app = FastAPI()
    app.include_router(router)
    state = ServerState(model="tiny", dtype="fp32", max_model_len=256, lora_rank=None, facts={},
                        weights_root=tmp_path, tensors=served, address="127.0.0.1:1")
    app.state.grouprl, app.state.engine_client = state, engine
    return TestClient(app), state


def post(client: TestClient, path: Path, version: int, resume: bool = False):
    return client.post("/grouprl/weights", json={"path": str(path), "version": version, "resume": resume})


def test_a_bad_push_is_refused_before_the_engine_is_touched_and_a_rollback_needs_resume(tmp_path, served, capsys):
    engine = Engine()
    client, state = server(tmp_path, served, engine)
    v7 = pushed(tmp_path, 7)
    assert post(client, v7, 7).status_code == 200 and state.version == 7
    engine.calls.clear()
    assert post(client, Path("/etc"), 8).status_code == 403
    assert post(client, tmp_path / "nowhere", 8).status_code == 400
    assert post(client, served_folder(tmp_path / "other", num_layers=3), 8).status_code == 422
    v3 = pushed(tmp_path, 3)
    rollback = post(client, v3, 3)
    assert rollback.status_code == 409 and "version 3 is not newer than the weights version 7" in rollback.text
    assert engine.calls == [] and state.version == 7
    assert post(client, v3, 3, resume=True).status_code == 200 and state.version == 3
    assert "version 3 accepted after version 7: its trainer resumes a run" in capsys.readouterr().out


def test_a_reload_that_fails_midway_refuses_generation_until_a_complete_push(tmp_path, served):
    v1, v2, v3 = pushed(tmp_path, 1), pushed(tmp_path, 2), pushed(tmp_path, 3)
    engine = Engine(failing=(v2,))
    client, state = server(tmp_path, served, engine)
    assert post(client, v1, 1).status_code == 200
    engine.calls.clear()
    answer = post(client, v2, 2)
    assert answer.status_code == 503 and f"the weights in {v2} did not load (RuntimeError: shapes moved" in answer.text
    assert engine.calls == ["pause_generation()", f"collective_rpc({v2})", "resume_generation()"]
    assert (state.version, state.weights_complete) == (1, False) and state.broken in answer.text
    assert client.get("/grouprl/info").json()["broken"] == state.broken
    assert post(client, v3, 3).status_code == 200
    assert (state.broken, state.weights_complete, state.version) == (None, True, 3)


def test_an_adapter_may_carry_its_bases_version_and_then_only_newer_ones():
    from fastapi import HTTPException

    from grouprl.serve.server.routes import _forward_only

    state = ServerState(model="tiny", dtype="fp32", max_model_len=256, lora_rank=4, facts={}, version=5)
    _forward_only(state, 5, False, adapter=True)  # the first adapter on base version 5
    state.adapter_version = 5
    with pytest.raises(HTTPException, match="version 5 is not newer than the adapter version 5"):
        _forward_only(state, 5, False, adapter=True)
    _forward_only(state, 6, False, adapter=True)
    with pytest.raises(HTTPException, match="version 4 is not newer than the weights version 5"):
        _forward_only(ServerState(model="t", dtype="fp32", max_model_len=1, lora_rank=4, facts={}, version=5), 4,
                      False, adapter=True)


def test_a_collective_push_made_again_tells_the_servers_that_finished_it_that_it_is_no_step_back():
    """A push made again once a member failed at its finish: the servers that finished hold its version already."""
    from grouprl.serve.client.collective import ServersClient
    from grouprl.serve.client.servers import RolloutServerError, Server, ServerFailure

    class Pool:
        timeout = 30.0

        def __init__(self):
            self.sent = []

        async def request(self, server, method, path, body, timeout=None):
            self.sent.append((server.address, path.rsplit("/", 1)[1], body))
            if server.address == "b:1" and path.endswith("/finish"):
                raise ServerFailure(server, "connection reset")
            return {"token": "t", "version": 5} if path.endswith("/start") else {"version": 5}

        def gather(self, coros):
            async def every():
                return await asyncio.gather(*coros, return_exceptions=True)

            return asyncio.run(every())

    pool = Pool()
    finished, failed = Server("a:1", info={"workers": 1}), Server("b:1", info={"workers": 1}, version=4)
    client = ServersClient(pool, [finished, failed])
    client.version, client.resume = 5, False
    with pytest.raises(RolloutServerError, match="rollout server b:1: connection reset"):
        client._all("/grouprl/transfer/finish", lambda s: {"token": "t"})
    assert (finished.version, failed.version) == (5, 4)
    client.start_weight_update()  # the push made again
    starts = {address: body["resume"] for address, what, body in pool.sent if what == "start"}
    assert starts == {"a:1": True, "b:1": False}
