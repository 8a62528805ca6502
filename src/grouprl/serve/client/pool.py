"""The trainer's connections to its rollout servers (one ``httpx.AsyncClient`` on an event loop in a daemon thread),
and the one owner of which servers serve. A server that fails a request (connection, 5xx, timeout) is dropped for
the rest of the run and its rows go to the servers left (a 4xx raises); with none left the run stops, to be resumed
from its last checkpoint.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
import warnings
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import httpx

from grouprl.serve.client import servers as roster
from grouprl.serve.client.servers import RolloutServerError, Server, ServerFailure, parse_address


def _tick(server: Server, now: float) -> None:
    if server.in_flight:
        server.busy_s += now - server.busy_from
    server.busy_from = now


class ServerPool:
    """Requests to the servers at ``addresses``, each bounded by ``timeout`` (``setting`` names it in messages)."""

    def __init__(self, addresses: Sequence[str], timeout: float, setting: str = "rollout_server_timeout",
                 token: str | None = None):
        if not addresses:
            raise ValueError("rollout_servers: give at least one host:port")
        if timeout <= 0:
            raise ValueError(f"{setting} must be > 0 seconds, got {timeout}")
        self.servers = [Server(parse_address(a)) for a in addresses]
        if len({s.address for s in self.servers}) != len(self.servers):
            raise ValueError(f"rollout_servers names a server twice: {', '.join(addresses)}")
        self.timeout, self.setting = float(timeout), setting
        self.roster_changes = 0  # drops: a collective forms its group again after one
        self.clock_from, self.clock_lock = time.monotonic(), threading.Lock()  # moved on the loop, read by the trainer
        self.waiting: set[concurrent.futures.Future] = set()  # handed out by submit, not settled yet
        self.closing, self.waiting_lock = False, threading.Lock()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="grouprl-rollout-servers", daemon=True)
        self.thread.start()
        self.client = self.run(self._make_client(token))

    async def _make_client(self, token: str | None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        return httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0)),
                                 limits=httpx.Limits(max_connections=256, max_keepalive_connections=64,
                                                     keepalive_expiry=roster.IDLE_REUSE_S))

    # -- the loop -----------------------------------------------------------------------------------
    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future:
        with self.waiting_lock:
            if self.closing:
                coro.close()
                raise RolloutServerError("the rollout servers' client is closed")
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
            self.waiting.add(future)
        future.add_done_callback(self._settled)
        return future

    def _settled(self, future: concurrent.futures.Future) -> None:
        with self.waiting_lock:
            self.waiting.discard(future)

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.submit(coro).result()

    def cancel(self) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(lambda: [task.cancel() for task in asyncio.all_tasks(self.loop)])

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.cancel()
        closed = self.submit(self.client.aclose())  # after the cancellation: call_soon_threadsafe keeps order
        with self.waiting_lock:
            self.closing = True
        with contextlib.suppress(Exception):  # a client that fails to close: its connections go with the loop
            closed.result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()
        with self.waiting_lock:
            left, self.waiting = list(self.waiting), set()
        for future in left:
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                future.set_exception(RolloutServerError("the rollout servers' client closed while this request waited"))

    # -- requests -----------------------------------------------------------------------------------
    async def request(self, server: Server, method: str, path: str, body: dict[str, Any] | None = None,
                      timeout: float | None = None) -> dict[str, Any]:
        """One JSON request; :class:`ServerFailure` when the server fails, :class:`RolloutServerError` on a 4xx."""
        limit = self.timeout if timeout is None else timeout
        self._clock(server, +1)
        try:
            response = await self.client.request(method, server.url + path, json=body, timeout=limit)
        except httpx.TimeoutException as e:
            raise ServerFailure(server, f"{method} {path} got no answer within {limit:g} s ({self.setting}; "
                                f"{type(e).__name__})") from e
        except httpx.TransportError as e:
            raise ServerFailure(server, f"{method} {path} failed: {type(e).__name__}: {e}") from e
        finally:
            self._clock(server, -1)
        if response.status_code >= 500:
            raise ServerFailure(server, f"{method} {path} answered {response.status_code}: {response.text[:300]}")
        if response.status_code >= 400:
            raise RolloutServerError(f"rollout server {server.address} refused {method} {path} "
                                     f"({response.status_code}): {response.text[:500]}")
        return response.json()

    async def info(self, server: Server) -> dict[str, Any]:
        server.info = await self.request(server, "GET", "/grouprl/info", timeout=min(self.timeout, 10.0))
        return server.info

    def gather(self, coros: Sequence[Coroutine[Any, Any, Any]]) -> list[Any]:
        async def every() -> list[Any]:
            return await asyncio.gather(*coros, return_exceptions=True)

        return self.run(every())

    def _clock(self, server: Server, change: int) -> None:
        with self.clock_lock:
            _tick(server, time.monotonic())
            server.in_flight += change

    def busy_shares(self) -> list[float]:
        """Each server's share of the time since the last call with a request in flight."""
        with self.clock_lock:
            now = time.monotonic()
            window, self.clock_from = max(now - self.clock_from, 1e-9), now
            shares = []
            for server in self.servers:
                _tick(server, now)
                shares.append(min(server.busy_s / window, 1.0))
                server.busy_s = 0.0
            return shares

    async def wait_ready(self) -> None:
        """Ask every living server for its info until it answers, or drop it after ``timeout``."""
        await asyncio.gather(*(self._ready(s) for s in self.alive))
        self.living()

    async def _ready(self, server: Server) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                info = await self.info(server)
                server.version, server.adapter = info.get("version"), info.get("adapter")
                return
            except ServerFailure as failure:
                if time.monotonic() > deadline or (server.describe_exit and "exited" in server.describe_exit(0.0)):
                    self.drop(ServerFailure(server, f"not ready within {self.timeout:g} s ({self.setting}); last: "
                                            f"{failure.what}"))
                    return
            await asyncio.sleep(roster.READY_POLL_S)

    async def _settle(self, coros: list[Coroutine[Any, Any, Any]]) -> list[bool]:
        """Run ``coros`` at once; the server of each :class:`ServerFailure` is dropped, any other error raised."""
        outcomes = await asyncio.gather(*coros, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, ServerFailure):
                self.drop(outcome)
            elif isinstance(outcome, BaseException):
                raise outcome
        return [not isinstance(outcome, BaseException) for outcome in outcomes]

    async def spread(self, work: Callable[[Server, int], Coroutine[Any, Any, Any]], items: int,
                     groups: Sequence[int]) -> list[Any]:
        """``work(server, i)`` for every item on the server of group ``groups[i]``, again elsewhere when it fails."""
        results: list[Any] = [None] * items
        pending = list(range(items))

        async def one(i: int, server: Server) -> None:
            results[i] = await work(server, i)

        while pending:
            servers = self.living()
            ok = await self._settle([one(i, servers[groups[i] % len(servers)]) for i in pending])
            pending = [i for i, done in zip(pending, ok) if not done]
        return results

    async def everywhere(self, work: Callable[[Server], Coroutine[Any, Any, Any]]) -> None:
        """``work(server)`` on every living server at once; a server that fails is dropped."""
        done: set[Server] = set()
        while servers := [s for s in self.living() if s not in done]:
            ok = await self._settle([work(s) for s in servers])
            done.update(s for s, good in zip(servers, ok) if good)

    # -- membership ---------------------------------------------------------------------------------
    @property
    def alive(self) -> list[Server]:
        return [s for s in self.servers if s.alive]

    def living(self) -> list[Server]:
        """The servers still serving, or :class:`RolloutServerError` saying what became of each."""
        if not self.alive:
            whys = "; ".join(f"{s.address}: {s.why}" for s in self.servers)
            raise RolloutServerError(f"no rollout server is left ({whys})")
        return self.alive

    def drop(self, failure: ServerFailure) -> None:
        """Take ``failure``'s server out for the rest of the run; a local one is killed (a hung server, or the engine
        process of a dead one, is not left running)."""
        server = failure.server
        if not server.alive:
            return
        server.alive = False
        self.roster_changes += 1
        server.why = failure.what + (f" ({server.describe_exit(roster.EXIT_SETTLE_S)})" if server.describe_exit else "")
        if server.stop is not None:
            server.stop()
        if left := self.alive:
            warnings.warn(f"rollout server {server.address} dropped: {server.why}; going on with {len(left)} of "
                          f"{len(self.servers)} servers ({', '.join(s.address for s in left)})", stacklevel=2)
