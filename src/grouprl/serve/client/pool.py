"""The trainer's connections to its rollout servers: one ``httpx.AsyncClient`` on an event loop in a daemon thread,
so requests stay in flight while the caller works (:meth:`ServerPool.submit`), each bounded by a timeout.

A server that refuses or drops a connection, answers 5xx or times out is dropped with a message naming it and
what failed; its rows go to the servers left, and with none left the call raises :class:`RolloutServerError`. A
4xx is the request's fault: it raises at once. A dropped server may come back (:mod:`.rejoin`).
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
from grouprl.serve.client.rejoin import Returns
from grouprl.serve.client.servers import RolloutServerError, Server, ServerFailure, parse_address


class ServerPool(Returns):
    """Requests to several rollout servers: ``timeout`` bounds each request (and :meth:`wait_ready`), ``setting``
    names it in messages; ``token`` is the servers' bearer token (never logged)."""

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
        self.roster_changes = 0  # drops and readmissions: a collective forms its group again after one
        self.takes_returns = False  # whether a dropped server is watched for its return
        # loads the current weights into a server that is back (None: the sampler's next push gives them)
        self.rejoin: Callable[[Server], Coroutine[Any, Any, None]] | None = None
        # whether a server process 0 restarts holds this process's weights yet (it answers before it does)
        self.holds_weights: Callable[[Server], bool] = lambda server: True
        self.watchers: set[asyncio.Task] = set()
        self.came_back = asyncio.Event()  # set on the loop when a server is back; used only there
        self.clock_from = time.monotonic()
        self.clock_lock = threading.Lock()  # the busy clock: moved on the loop, read by the trainer
        self.waiting: set[concurrent.futures.Future] = set()  # what submit handed out and the loop has not settled
        self.closing = False
        self.waiting_lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="grouprl-rollout-servers", daemon=True)
        self.thread.start()
        self.client = self.run(self._make_client(token))

    async def _make_client(self, token: str | None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        return httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0)),
                                 limits=httpx.Limits(max_connections=256, max_keepalive_connections=64,
                                                     keepalive_expiry=roster.IDLE_REUSE_S))

    # -- running coroutines on the pool's loop ------------------------------------------------------
    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future:
        """Run ``coro`` on the pool's loop; its future, at once (failed by :meth:`close` if still unsettled, so no
        thread waits forever)."""
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
        """Run ``coro`` on the pool's loop and wait for it."""
        return self.submit(coro).result()

    def cancel(self) -> None:
        """Cancel every coroutine running on the loop."""
        if self.loop.is_closed():
            return

        def cancel_all() -> None:
            for task in asyncio.all_tasks(self.loop):
                task.cancel()

        self.loop.call_soon_threadsafe(cancel_all)

    def close(self) -> None:
        """Cancel what runs, close the HTTP client, stop the loop, fail every future left unsettled."""
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
            if not future.done():
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    future.set_exception(RolloutServerError("the rollout servers' client closed while this "
                                                            "request waited"))

    # -- servers ------------------------------------------------------------------------------------
    @property
    def alive(self) -> list[Server]:
        return [s for s in self.servers if s.alive]

    def living(self) -> list[Server]:
        """The servers still serving, or :class:`RolloutServerError` saying what became of each."""
        alive = self.alive
        if not alive:
            whys = "; ".join(f"{s.address}: {s.why}" for s in self.servers)
            raise RolloutServerError(f"no rollout server is left ({whys})")
        return alive

    def drop(self, failure: ServerFailure) -> None:
        server = failure.server
        if not server.alive:
            return
        server.alive = False
        self.roster_changes += 1
        server.why = failure.what + (f" ({server.describe_exit(roster.EXIT_SETTLE_S)})" if server.describe_exit else "")
        if server.stop is not None:  # a hung server, or the engine process of a dead one, is not left running
            server.stop()
        coming = self._watch(server)
        left = self.alive
        if left:
            warnings.warn(f"rollout server {server.address} dropped: {server.why}; going on with {len(left)} of "
                          f"{len(self.servers)} servers ({', '.join(s.address for s in left)}){coming}",
                          stacklevel=2)

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

    def _clock(self, server: Server, change: int) -> None:
        with self.clock_lock:
            now = time.monotonic()
            if server.in_flight:
                server.busy_s += now - server.busy_from
            server.busy_from = now
            server.in_flight += change

    def busy_shares(self) -> list[float]:
        """Each server's share of the time since the last call with a request of this pool in flight."""
        with self.clock_lock:
            now = time.monotonic()
            window = max(now - self.clock_from, 1e-9)
            shares = []
            for server in self.servers:
                if server.in_flight:
                    server.busy_s += now - server.busy_from
                server.busy_from = now
                shares.append(min(server.busy_s / window, 1.0))
                server.busy_s = 0.0
            self.clock_from = now
            return shares

    async def wait_ready(self) -> None:
        """Ask every living server for its info until it answers, or drop it after ``timeout``."""
        await asyncio.gather(*(self._ready(s) for s in self.alive))
        self.living()

    async def _ready(self, server: Server) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                server.info = await self.request(server, "GET", "/grouprl/info", timeout=min(self.timeout, 10.0))
                server.version, server.adapter = server.info.get("version"), server.info.get("adapter")
                return
            except ServerFailure as failure:
                if time.monotonic() > deadline or (server.describe_exit and "exited" in server.describe_exit(0.0)):
                    self.drop(ServerFailure(server, f"not ready within {self.timeout:g} s ({self.setting}); last: "
                                            f"{failure.what}"))
                    return
            await asyncio.sleep(roster.READY_POLL_S)

    # -- the work -----------------------------------------------------------------------------------
    async def spread(self, work: Callable[[Server, int], Coroutine[Any, Any, Any]], items: int,
                     groups: Sequence[int]) -> list[Any]:
        """``work(server, i)`` for every item, on the server of its group ``groups[i]`` (modulo the servers left),
        again elsewhere when that one fails; results in item order."""
        results: list[Any] = [None] * items
        done = [False] * items
        while not all(done):
            servers = await self._serving()
            pending = [i for i in range(items) if not done[i]]
            chosen = [servers[groups[i] % len(servers)] for i in pending]

            async def one(i: int, server: Server) -> None:
                results[i] = await work(server, i)
                done[i] = True

            outcomes = await asyncio.gather(*(one(i, s) for i, s in zip(pending, chosen)), return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, ServerFailure):
                    self.drop(outcome)
                elif isinstance(outcome, BaseException):
                    raise outcome
        return results

    async def everywhere(self, work: Callable[[Server], Coroutine[Any, Any, Any]]) -> None:
        """``work(server)`` on every living server at once; a server that fails is dropped."""
        done: set[Server] = set()
        while True:
            servers = [s for s in await self._serving() if s not in done]
            if not servers:
                return
            outcomes = await asyncio.gather(*(work(s) for s in servers), return_exceptions=True)
            for server, outcome in zip(servers, outcomes):
                if isinstance(outcome, ServerFailure):
                    self.drop(outcome)
                elif isinstance(outcome, BaseException):
                    raise outcome
                else:
                    done.add(server)
