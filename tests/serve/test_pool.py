"""The trainer's connections to rollout servers (grouprl.serve.client.pool) against small HTTP servers on
127.0.0.1 that answer, fail (500), refuse a request (400), hang past the timeout or are not there at
all. What a server's answer becomes is in test_completions.py, the real servers (vLLM) in test_servers.py."""

from __future__ import annotations

import threading
import time

import pytest

from grouprl.serve.client.pool import ServerPool
from grouprl.serve.client.servers import RolloutServerError, free_port, parse_address
from tests.helpers.servers import FakeServer, JsonHandler


class Stub(FakeServer):
    """An HTTP server on 127.0.0.1 whose every answer is ``mode``: ok (200 with the path it was asked),
    error (500), refuse (400) or hang (no answer for 5 s)."""

    def __init__(self, mode: str):
        stub = self

        class Handler(JsonHandler):
            def answer(self) -> None:
                stub.asked += 1
                if stub.mode == "hang":
                    time.sleep(5)
                    return
                code = {"ok": 200, "error": 500, "refuse": 400}[stub.mode]
                self.reply({"path": self.path, "version": stub.version, "adapter": None}, code)

            do_GET = do_POST = answer

        self.mode, self.asked, self.version = mode, 0, None
        super().__init__(Handler)


@pytest.fixture
def stubs():
    made = []

    def make(mode):
        made.append(Stub(mode))
        return made[-1]

    yield make
    for s in made:
        s.close()


def spread(pool, items=6):
    async def work(server, i):
        return (server.address, (await pool.request(server, "POST", f"/row/{i}", {}))["path"])

    return pool.run(pool.spread(work, items, [i // 2 for i in range(items)]))


def test_groups_go_round_robin_and_a_failing_server_hands_its_rows_to_the_others(stubs):
    good, bad = stubs("ok"), stubs("error")
    pool = ServerPool([good.address, bad.address], timeout=5)
    try:
        with pytest.warns(UserWarning, match=rf"rollout server {bad.address} dropped: POST /row/\d answered 500.*"
                                             rf"going on with 1 of 2 servers \({good.address}\)"):
            out = spread(pool)
        assert out == [(good.address, f"/row/{i}") for i in range(6)]  # in item order, all from the one left
        assert bad.asked == 2  # group 1 (rows 2 and 3) went to it first
        assert [s.address for s in pool.alive] == [good.address]
    finally:
        pool.close()


def test_a_server_that_does_not_answer_within_the_timeout_is_named_with_the_timeout(stubs):
    slow = stubs("hang")
    pool = ServerPool([slow.address], timeout=0.5)
    try:
        start = time.perf_counter()
        with pytest.raises(RolloutServerError) as caught:
            spread(pool, items=2)
        assert time.perf_counter() - start < 4.5  # the 0.5 s timeout, not the server's 5 s
        said = str(caught.value)
        assert f"no rollout server is left ({slow.address}: POST /row/0 got no answer within 0.5 s " in said
        assert "rollout_server_timeout" in said
    finally:
        pool.close()


def test_a_server_that_is_not_there_is_dropped_after_the_timeout_and_named(stubs):
    good = stubs("ok")
    gone = f"127.0.0.1:{free_port()}"
    pool = ServerPool([gone, good.address], timeout=1.0)
    try:
        said = rf"rollout server {gone} dropped: not ready within 1 s \(rollout_server_timeout\); last: GET " \
            r"/grouprl/info failed: ConnectError"
        with pytest.warns(UserWarning, match=said):
            pool.run(pool.wait_ready())
        assert [s.address for s in pool.alive] == [good.address]
    finally:
        pool.close()
    alone = ServerPool([gone], timeout=0.5)
    try:
        with pytest.raises(RolloutServerError, match=rf"no rollout server is left \({gone}: not ready within 0.5 s"):
            alone.run(alone.wait_ready())
    finally:
        alone.close()


def test_a_refused_request_is_the_requests_fault_not_the_servers(stubs):
    strict = stubs("refuse")
    pool = ServerPool([strict.address], timeout=5)
    try:
        with pytest.raises(RolloutServerError, match=rf"rollout server {strict.address} refused POST /row/\d \(400\)"):
            spread(pool, items=2)
        assert pool.alive  # still serving
    finally:
        pool.close()


class KeepAliveStub(FakeServer):
    """An HTTP/1.1 server that keeps connections open and counts those it accepted."""

    def __init__(self):
        stub = self

        class Handler(JsonHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                stub.connections += 1
                super().setup()

            def do_GET(self) -> None:
                self.reply({})

        self.connections = 0
        super().__init__(Handler)


def test_a_connection_left_idle_is_not_sent_on_again_near_the_servers_keep_alive():
    """A request sent on a connection the server is closing fails as if the server had dropped it: the pool
    reuses a connection only while it is idle well inside the server's keep-alive, and opens a new one after."""
    from grouprl.serve.client import servers as roster

    assert roster.IDLE_REUSE_S <= roster.SERVER_KEEP_ALIVE_S / 2
    stub = KeepAliveStub()
    pool = ServerPool([stub.address], timeout=10)
    try:
        server = pool.servers[0]
        pool.run(pool.request(server, "GET", "/a"))
        pool.run(pool.request(server, "GET", "/b"))
        assert stub.connections == 1  # back to back: the same connection
        time.sleep(roster.IDLE_REUSE_S + 0.5)
        pool.run(pool.request(server, "GET", "/c"))
        assert stub.connections == 2
    finally:
        pool.close()
        stub.http.shutdown()
        stub.http.server_close()


def test_pool_settings_are_checked_before_anything_starts():
    with pytest.raises(ValueError, match="names a server twice"):
        ServerPool(["127.0.0.1:8000", "127.0.0.1:8000"], timeout=5)
    with pytest.raises(ValueError, match="rollout_server_timeout must be > 0"):
        ServerPool(["127.0.0.1:8000"], timeout=0)
    with pytest.raises(ValueError, match="give at least one"):
        ServerPool([], timeout=5)
    assert parse_address(" 10.1.2.3:0080 ") == "10.1.2.3:80"


def test_closing_the_pool_ends_every_wait_on_it_even_one_its_cancellation_misses():
    """A thread waiting on the pool when it closes gets an error, not a wait without end: a non-daemon thread
    left waiting on a stopped loop keeps its process from ever exiting (seen: a weight-transfer join whose
    request started after the failed join cancelled the pool's requests)."""
    import asyncio
    import concurrent.futures

    pool = ServerPool([f"127.0.0.1:{free_port('127.0.0.1')}"], timeout=60)
    got: dict[str, BaseException] = {}

    async def stubborn() -> None:  # a coroutine that outlives cancellation
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue

    def wait(name: str, coro) -> None:
        try:
            pool.run(coro)
        except BaseException as e:  # noqa: BLE001 - recorded for the assertion
            got[name] = e

    waiters = [threading.Thread(target=wait, args=("plain", asyncio.sleep(3600))),
               threading.Thread(target=wait, args=("stubborn", stubborn()))]
    for w in waiters:
        w.start()
    time.sleep(0.3)
    pool.close()
    for w in waiters:
        w.join(timeout=30)
    assert not any(w.is_alive() for w in waiters)
    assert isinstance(got["plain"], concurrent.futures.CancelledError), got
    assert isinstance(got["stubborn"], RolloutServerError) and "closed while this request waited" in str(
        got["stubborn"]), got
    with pytest.raises(RolloutServerError, match="closed"):
        pool.run(asyncio.sleep(0))


# ------------------------------------------------------------------------------------------------ drops
def test_a_dropped_server_stays_out_when_it_answers_again_and_with_none_left_a_rollout_fails_at_once(stubs):
    good, flaky = stubs("ok"), stubs("error")
    pool = ServerPool([good.address, flaky.address], timeout=1000.0)  # past the suite's pytest-timeout
    try:
        with pytest.warns(UserWarning, match=rf"{flaky.address} dropped: POST /row/\d answered 500"):
            spread(pool)
        flaky.mode = "ok"
        asked = flaky.asked
        assert [a for a, _ in spread(pool)] == [good.address] * 6 and flaky.asked == asked  # never asked again
        good.mode = "error"
        with pytest.raises(RolloutServerError, match=rf"no rollout server is left \({good.address}: .*; "
                                                     rf"{flaky.address}: POST"):
            spread(pool, items=2)  # at once: a wait for the pool's timeout would fail the test by pytest-timeout
    finally:
        pool.close()
