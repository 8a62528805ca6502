"""The trainer's connections to its rollout servers: one ``httpx.AsyncClient`` on an event loop of its own
(a daemon thread), so requests stay in flight while the caller's thread does other work
(:meth:`ServerPool.submit` returns a future), every request bounded by a timeout.

Faults: a server that refuses a connection, drops one, answers with a server error (5xx) or does not
answer within the timeout is dropped with a message naming it (host:port), what failed and the timeout
value; the rows it had not returned go to the servers left, and the run goes on, saying so. With no
server left the call raises :class:`RolloutServerError`. A 4xx answer is the request's fault, not the
server's: it raises at once with the server's message.

Returns (when the pool is told to take them back, ``takes_returns``): a dropped server is watched on the
pool's loop. One started by the run is restarted (its
``restart``, while ``restarts_left``); any other is asked every :data:`RETURN_POLL_S` seconds whether it
answers again. One that answers is *back* (:meth:`ServerPool.back_servers`): at the sampler's next weight
sync it is given the current weights and put back in the rotation: through ``rejoin`` (the files transport,
:meth:`ServerPool.rejoin_back`), or as a member of the group the next push forms (a collective transport).
With ``rejoin``, a rollout that finds no server left waits for one the run is restarting (up to the
timeout) and loads its weights itself: no push can run meanwhile, as the pushing thread is the one
waiting on the rollout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
import warnings
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

READY_POLL_S = 1.0
"""How often :meth:`ServerPool.wait_ready` asks a server that does not answer yet."""
EXIT_SETTLE_S = 2.0
"""How long a dropped local server's process is given to finish exiting, so the message names its exit status."""
RETURN_POLL_S = 10.0
"""How often a dropped server the run did not start is asked whether it answers again."""


class RolloutServerError(ConnectionError):
    """No rollout server can serve the run (each one's address and what failed is in the message), or a
    server refused a request."""


class ServerFailure(Exception):
    """One server failed one request (internal: the pool drops the server and retries elsewhere)."""

    def __init__(self, server: Server, what: str):
        super().__init__(f"{server.address}: {what}")
        self.server, self.what = server, what


@dataclass(eq=False)
class Server:
    """One rollout server as the trainer sees it."""

    address: str
    """host:port."""
    alive: bool = True
    why: str = ""
    """What failed, once dropped."""
    adapter: str | None = None
    """The LoRA adapter's name on this server (a request's ``model``); None: the base weights."""
    version: int | None = None
    """The policy version it holds."""
    info: dict[str, Any] | None = None
    describe_exit: Callable[[float], str] | None = None
    """For a server started here: its process's state (exit status, last log lines), added to messages; its
    argument is how long to wait for a process that is exiting."""
    stop: Callable[[], None] | None = None
    """For a server started here: ends what is left of its processes once it is dropped."""
    restart: Callable[[], None] | None = None
    """For a server started here: starts its process again, on the same address."""
    restarts_left: int = 0
    """How many more times ``restart`` may be called."""
    returning: bool = False
    """Dropped, and watched for its return."""
    back: bool = False
    """Dropped and answering again: readmitted once it holds the current weights."""
    readmits: int = 0
    """How many times it came back and was readmitted."""
    restarted_from: Any = None
    """The model folder its last restart started from (removed once it is back)."""
    in_flight: int = 0
    """Requests of this pool it is answering now."""
    busy_s: float = 0.0
    """Seconds with a request in flight since the busy clock was last read (:meth:`ServerPool.busy_shares`)."""
    busy_from: float = 0.0
    """When the current stretch of requests in flight (or the clock) started."""

    @property
    def url(self) -> str:
        return f"http://{self.address}"


def parse_address(text: str, field: str = "rollout_servers") -> str:
    """``host:port`` checked (a port in 1..65535), or a ValueError naming ``field``."""
    host, sep, port = str(text).strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{field}: {text!r} is not host:port (e.g. 127.0.0.1:8000)")
    return f"{host}:{int(port)}"


class ServerPool:
    """Requests to several rollout servers; see the module docstring.

    Args:
        addresses: host:port of each server.
        timeout: seconds one request may take (a completion, or a weight load) before its server is
            dropped; also how long :meth:`wait_ready` waits for a server to come up.
        setting: the config field that sets ``timeout``, named in messages.
    """

    def __init__(self, addresses: Sequence[str], timeout: float, setting: str = "rollout_server_timeout"):
        if not addresses:
            raise ValueError("rollout_servers: give at least one host:port")
        if timeout <= 0:
            raise ValueError(f"{setting} must be > 0 seconds, got {timeout}")
        self.servers = [Server(parse_address(a)) for a in addresses]
        if len({s.address for s in self.servers}) != len(self.servers):
            raise ValueError(f"rollout_servers names a server twice: {', '.join(addresses)}")
        self.timeout, self.setting = float(timeout), setting
        self.roster_changes = 0
        """How many times a server was dropped or readmitted (a collective forms its group again after one)."""
        self.takes_returns = False
        """Whether a dropped server is watched for its return (see the module docstring)."""
        self.rejoin: Callable[[Server], Coroutine[Any, Any, None]] | None = None
        """Loads the current weights into a server that is back, on the loop (None: the sampler gives them at
        its next push)."""
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
        self.client = self.run(self._make_client())

    async def _make_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0)),
                                 limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))

    # -- running coroutines on the pool's loop ------------------------------------------------------
    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future:
        """Run ``coro`` on the pool's loop; its future, at once. A future the loop has not settled when the pool
        closes raises :class:`RolloutServerError` (a thread waiting on it would otherwise wait forever, and a
        process whose non-daemon thread waits never exits)."""
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
        """Cancel every coroutine running on the loop: the futures of :meth:`submit` raise CancelledError."""
        if self.loop.is_closed():
            return

        def cancel_all() -> None:
            for task in asyncio.all_tasks(self.loop):
                task.cancel()

        self.loop.call_soon_threadsafe(cancel_all)

    def close(self) -> None:
        """Cancel what still runs on the loop, close the HTTP client, stop the loop, and fail every future
        the loop left unsettled."""
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
        server.why = failure.what + (f" ({server.describe_exit(EXIT_SETTLE_S)})" if server.describe_exit else "")
        if server.stop is not None:  # a hung server, or the engine process of a dead one, is not left running
            server.stop()
        coming = self._watch(server)
        left = self.alive
        if left:
            warnings.warn(f"rollout server {server.address} dropped: {server.why}; going on with {len(left)} of "
                          f"{len(self.servers)} servers ({', '.join(s.address for s in left)}){coming}",
                          stacklevel=2)

    # -- returns --------------------------------------------------------------------------------------
    def _watch(self, server: Server) -> str:
        """Watch the dropped ``server`` for its return (where the pool takes returns); what will happen, said."""
        if not self.takes_returns or self.loop.is_closed():
            return ""
        server.returning, server.back = True, False

        def start() -> None:
            task = self.loop.create_task(self._await_return(server))
            self.watchers.add(task)
            task.add_done_callback(self.watchers.discard)

        self.loop.call_soon_threadsafe(start)
        if server.restart is None:
            return "; it rejoins if it answers again"
        return f"; restarting it ({server.restarts_left} restart(s) left)" if server.restarts_left > 0 else ""

    def watch_returning(self) -> None:
        """Watch again every dropped server still expected back (after :meth:`cancel` ended the watchers)."""
        for server in self.servers:
            if server.returning and not server.alive and not server.back:
                self._watch(server)

    def drop_again(self, server: Server, what: str) -> None:
        """A server that was back failed before it served: dropped as before, watched again."""
        server.back = False
        server.why += f"; {what}"
        if server.stop is not None:
            server.stop()
        self._watch(server)

    async def _await_return(self, server: Server) -> None:
        """Until ``server`` answers again (then it is :attr:`Server.back`) or cannot come back (its restarts
        spent: ``returning`` ends, its ``why`` says so)."""
        while True:
            local = server.restart is not None
            if local:
                if server.restarts_left <= 0:
                    server.returning = False
                    server.why += "; no restart left"
                    return
                server.restarts_left -= 1
                try:
                    server.restart()
                except Exception as e:  # noqa: BLE001 - said in the server's reason, the run goes on without it
                    server.why += f"; its restart failed: {type(e).__name__}: {e}"
                    continue
            deadline = time.monotonic() + self.timeout
            while not local or time.monotonic() < deadline:
                try:
                    server.info = await self.request(server, "GET", "/grouprl/info", timeout=min(self.timeout, 10.0))
                    server.back = True
                    self.came_back.set()
                    return
                except ServerFailure as failure:
                    if local and server.describe_exit and "exited" in server.describe_exit(0.0):
                        server.why += f"; restarted, then {server.describe_exit(0.0)}"
                        break
                    last = failure.what
                await asyncio.sleep(READY_POLL_S if local else RETURN_POLL_S)
            else:
                server.why += f"; restarted, not ready within {self.timeout:g} s ({self.setting}; last: {last})"
            if server.stop is not None:
                server.stop()

    def back_servers(self) -> list[Server]:
        """The dropped servers answering again, to be given the current weights and readmitted."""
        return [s for s in self.servers if s.back and not s.alive]

    def readmit(self, server: Server) -> None:
        """``server`` holds the current weights: back in the rotation, said."""
        server.alive, server.back, server.returning = True, False, False
        server.readmits += 1
        self.roster_changes += 1
        was, server.why = server.why, ""
        warnings.warn(f"rollout server {server.address} is back (dropped earlier: {was}); serving with "
                      f"{len(self.alive)} of {len(self.servers)} servers", stacklevel=2)

    async def rejoin_back(self) -> None:
        """Every server that is back given the current weights (``rejoin``) and readmitted; one whose load fails
        is dropped again."""
        for server in self.back_servers():
            try:
                await self.rejoin(server)
            except ServerFailure as failure:
                self.drop_again(server, f"back, then its weights failed to load: {failure.what}")
                continue
            self.readmit(server)

    async def _serving(self) -> list[Server]:
        """The servers serving; with none left, the first one the run restarts that comes back within the
        timeout, its weights loaded here (see the module docstring). A server the run did not start is not
        waited for: someone has to start it again."""
        deadline = time.monotonic() + self.timeout
        while not self.alive and self.rejoin is not None and time.monotonic() < deadline \
                and any(s.returning and s.restart is not None for s in self.servers):  # one the run restarts
            await self.rejoin_back()
            if not self.alive:
                self.came_back.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.came_back.wait(), timeout=min(READY_POLL_S, self.timeout))
        return self.living()

    async def request(self, server: Server, method: str, path: str, body: dict[str, Any] | None = None,
                      timeout: float | None = None) -> dict[str, Any]:
        """One JSON request; :class:`ServerFailure` when the server fails, :class:`RolloutServerError`
        when it refuses the request (4xx)."""
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
        """Each server's share of the time since the last call (or the pool's start) with a request of this
        pool in flight (generating, or loading weights); the clock restarts."""
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
        """Ask every server for its info until it answers (or ``timeout`` passes: it is dropped)."""
        await asyncio.gather(*(self._ready(s) for s in self.servers))
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
            await asyncio.sleep(READY_POLL_S)

    # -- the work -----------------------------------------------------------------------------------
    async def spread(self, work: Callable[[Server, int], Coroutine[Any, Any, Any]], items: int,
                     groups: Sequence[int]) -> list[Any]:
        """``work(server, i)`` for every item ``i``; item ``i`` runs on the server of its group
        ``groups[i]`` (group g on the g-th server left, modulo their number), and again on another one
        when its server fails. Results in item order."""
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
        """``work(server)`` on every living server at once; a server that fails is dropped. With none left, on
        the first one the run restarts that comes back in time (:meth:`_serving`)."""
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
