"""The guard around a rollout server's app (grouprl.serve.server.guard), on a stand-in app: who gets through, what is
refused before the app sees it, and where a server's token comes from. No vLLM."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from types import SimpleNamespace

import httpx
import pytest

from grouprl.serve.server.guard import TOKEN_ENV, Guard, authorised, generation_problem, is_loopback, server_token

TOKEN = "s3cret-token-of-the-servers-0123"


class App:
    """Answers 200 with what it received (path and body), so a test sees what got through."""

    def __init__(self):
        self.seen: list[tuple[str, bytes]] = []

    async def __call__(self, scope, receive, send):
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self.seen.append((scope["path"], body))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})


def call(method, path, *, app=None, headers=None, body=None, content=None, broken=None, max_body=1 << 20):
    app = app or App()
    state = SimpleNamespace(max_model_len=256, broken=broken)
    guard = Guard(app, TOKEN, state, max_rows=8, max_body_bytes=max_body)

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=guard), base_url="http://server") as client:
            return await client.request(method, path, headers=headers, json=body, content=content)

    return asyncio.run(go()), app


BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize("path", ["/grouprl/weights", "/grouprl/transfer/init", "/inference/v1/generate",
                                  "/v1/completions", "/tokenize", "/metrics"])
@pytest.mark.parametrize("headers", [None, {"Authorization": "Bearer wrong-token-of-the-same-size!!"},
                                     {"Authorization": TOKEN}, {"Authorization": f"Basic {TOKEN}"}])
def test_every_route_but_health_refuses_a_request_without_the_token_before_the_app_sees_it(path, headers):
    answer, app = call("POST", path, headers=headers, body={"path": "/etc", "version": 7})
    assert answer.status_code == 401 and app.seen == []
    assert answer.headers["www-authenticate"] == "Bearer"
    said = answer.json()["error"]
    assert "Authorization: Bearer <token>" in said and TOKEN_ENV in said
    assert TOKEN not in said and "wrong-token" not in said  # what was sent is never echoed


def test_the_health_check_is_open_and_the_token_opens_the_rest():
    assert call("GET", "/health")[0].status_code == 200
    assert call("POST", "/health")[0].status_code == 401  # open to a liveness check, not to anything posted
    answer, app = call("POST", "/grouprl/weights", headers=BEARER, body={"version": 7})
    assert answer.status_code == 200 and app.seen == [("/grouprl/weights", b'{"version":7}')]  # the body replayed
    assert call("GET", "/grouprl/info", headers={"authorization": f"bearer  {TOKEN}"})[0].status_code == 200


def test_the_token_is_compared_whole():
    assert authorised(f"Bearer {TOKEN}", TOKEN)
    assert not authorised(f"Bearer {TOKEN[:-1]}", TOKEN) and not authorised(f"Bearer {TOKEN}x", TOKEN)
    assert not authorised(None, TOKEN) and not authorised("Bearer ", TOKEN)
    with pytest.raises(ValueError, match="needs a token"):
        Guard(App(), "", SimpleNamespace(), max_rows=1)


def test_a_body_over_the_cap_is_a_413_declared_or_streamed():
    declared, app = call("POST", "/grouprl/weights", headers=BEARER, content=b"x" * 2000, max_body=1000)
    assert declared.status_code == 413 and app.seen == [] and "at most 1000" in declared.json()["error"]

    async def chunks():  # no content-length: the guard counts what arrives
        for _ in range(5):
            yield b"y" * 300

    streamed, app = call("POST", "/grouprl/weights", headers=BEARER, content=chunks(), max_body=1000)
    assert streamed.status_code == 413 and app.seen == []
    under, app = call("POST", "/grouprl/weights", headers=BEARER, content=b"z" * 999, max_body=1000)
    assert under.status_code == 200 and app.seen == [("/grouprl/weights", b"z" * 999)]


@pytest.mark.parametrize("path, body, said", [
    ("/inference/v1/generate", {"token_ids": [1, 2], "sampling_params": {"n": 9}}, "1 prompt(s) x n=9 = 9 rows"),
    ("/v1/completions", {"prompt": [[1], [2], [3]], "n": 3}, "3 prompt(s) x n=3 = 9 rows"),
    ("/v1/completions", {"prompt": ["a"] * 9}, "9 prompt(s) x n=1"),
    ("/inference/v1/generate", {"token_ids": [1], "sampling_params": {"max_tokens": 257}}, "max_tokens=257"),
    ("/v1/chat/completions", {"messages": [], "max_completion_tokens": 10**9}, "max_completion_tokens=1000000000"),
])
def test_a_generation_request_over_the_servers_limits_is_a_400_naming_the_field(path, body, said):
    answer, app = call("POST", path, headers=BEARER, body=body)
    assert answer.status_code == 400 and app.seen == [] and said in answer.json()["error"]


def test_requests_within_the_limits_and_bodies_left_to_vllm_go_through():
    within = {"token_ids": [1, 2], "sampling_params": {"n": 8, "max_tokens": 256}}
    for path, body in [("/inference/v1/generate", within),
                       ("/v1/completions", {"prompt": "a", "n": "many"}),  # vLLM refuses an ill-typed field itself
                       ("/v1/completions", [1, 2])]:
        assert call("POST", path, headers=BEARER, body=body)[0].status_code == 200
    assert call("POST", "/v1/completions", headers=BEARER, content=b"{not json")[0].status_code == 200


def test_a_server_with_broken_weights_answers_generation_with_a_503_saying_why_and_still_takes_pushes():
    why = "the weights in /w/v3 did not load (RuntimeError: shapes moved)"
    answer, app = call("POST", "/inference/v1/generate", headers=BEARER, body={"token_ids": [1]}, broken=why)
    assert answer.status_code == 503 and why in answer.json()["error"] and app.seen == []
    assert call("POST", "/grouprl/weights", headers=BEARER, body={}, broken=why)[0].status_code == 200


def test_generation_limits_count_prompts_and_samples():
    assert generation_problem("/inference/v1/generate", {"token_ids": [5] * 100}, 1, 256) is None
    assert generation_problem("/v1/completions", {"prompt": [[1], [2]], "n": 4}, 8, 256) is None
    assert "9 rows" in generation_problem("/v1/completions", {"prompt": [[1], [2], [3]], "n": 3}, 8, 256)
    assert generation_problem("/v1/completions", {"max_tokens": True}, 8, 256) is None  # a bool is not a count


def test_a_server_takes_its_token_from_the_flag_then_the_environment(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "from-the-environment-0123")
    assert server_token("from-the-flag-0123456789", "0.0.0.0", 8000) == "from-the-flag-0123456789"
    assert server_token(None, "0.0.0.0", 8000) == "from-the-environment-0123"
    with pytest.raises(ValueError, match="at least 16 characters"):
        server_token("short", "127.0.0.1", 8000)


def test_beyond_this_machine_a_server_without_a_token_is_refused_saying_how(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    for host in ("0.0.0.0", "10.1.2.3", "::", "gpu-node-7"):
        with pytest.raises(ValueError, match=f"--host {host} listens beyond this machine and needs a token: set "
                                             f"{TOKEN_ENV}"):
            server_token(None, host, 8000)
    assert [is_loopback(h) for h in ("127.0.0.1", "127.9.9.9", "::1", "localhost")] == [True] * 4


def test_on_a_loopback_address_a_server_makes_a_token_and_writes_it_for_its_user_alone(monkeypatch, tmp_path):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    said: list[str] = []
    first = server_token(None, "127.0.0.1", 8123, echo=said.append)
    path = tmp_path / "grouprl" / "server-8123.token"
    assert path.read_text() == first + "\n" and len(first) >= 40
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert said == [f"grouprl serve: no token given; made one, in {path} (readable by this user only): give it to "
                    f"trainers as {TOKEN_ENV} or rollout_server_token"]
    os.chmod(path, 0o644)  # a file left readable by others is made private again when the token is rewritten
    second = server_token(None, "127.0.0.1", 8123, echo=said.append)
    assert second != first and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert first not in json.dumps(said)


def test_grouprl_serve_beyond_this_machine_without_a_token_stops_before_loading_anything(monkeypatch, capsys):
    from grouprl import cli
    from grouprl.cli import build

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.setattr(build, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert cli.main(["serve", "--host", "0.0.0.0", "--model", "tiny"]) == 2
    assert "--host 0.0.0.0 listens beyond this machine and needs a token" in capsys.readouterr().err


def test_grouprl_serve_with_a_weights_root_that_is_not_a_folder_stops_before_loading_anything(monkeypatch, capsys,
                                                                                              tmp_path):
    from grouprl import cli
    from grouprl.cli import build

    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setattr(build, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert cli.main(["serve", "--model", "tiny", "--weights_root", str(tmp_path / "unmounted")]) == 2
    assert f"--weights_root {tmp_path / 'unmounted'} is not a folder" in capsys.readouterr().err


def test_a_refused_requests_unread_body_is_read_and_dropped_after_the_answer_so_the_answer_arrives():
    """A connection closed on unread data is reset, and the client may lose the answer: the guard reads what is
    left (bounded) after answering, and keeps none of it."""
    chunks = [{"type": "http.request", "body": b"x" * 1000, "more_body": True} for _ in range(5)]
    chunks[-1]["more_body"] = False
    sent: list[dict] = []

    async def receive():
        return chunks.pop(0)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": "/grouprl/weights", "method": "POST", "headers": [(b"content-length", b"5000")]}
    guard = Guard(App(), TOKEN, SimpleNamespace(max_model_len=256, broken=None), max_rows=8, max_body_bytes=100000)
    asyncio.run(guard(scope, receive, send))
    assert sent[0]["status"] == 401 and chunks == []  # answered, then the whole body read and dropped
    scope["headers"] = [(b"authorization", f"Bearer {TOKEN}".encode()), (b"content-length", b"10000000")]
    chunks[:] = [{"type": "http.request", "body": b"y" * 1000, "more_body": True} for _ in range(1000)]
    sent.clear()
    small = Guard(App(), TOKEN, SimpleNamespace(max_model_len=256, broken=None), max_rows=8, max_body_bytes=100)
    asyncio.run(small(scope, receive, send))
    assert sent[0]["status"] == 413 and len(chunks) == 999  # one chunk read: past 4x the cap of 100 bytes, it stops
