"""A dropped rollout server coming back: the part of :class:`~.pool.ServerPool` that watches for it.

Where the pool takes returns, a dropped server the run started is restarted (while ``restarts_left``), any other
asked every :data:`~.servers.RETURN_POLL_S` s whether it answers. One that answers is *back*: at the next weight
sync it is given the current weights (``rejoin`` for files, or the group the next collective push forms) and
readmitted. With ``rejoin``, a rollout that finds no server left waits for one the run restarts and loads its
weights itself (the pushing thread is the one waiting). In trainer processes but 0, a server process 0 restarts
is back once it holds this process's weights (``holds_weights``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import warnings
from typing import Any

from grouprl.serve.client import servers as roster
from grouprl.serve.client.servers import Server, ServerFailure


class Returns:
    """:class:`~.pool.ServerPool`'s returns (it also calls the pool's ``request``, ``alive`` and ``living``)."""

    servers: list[Server]
    loop: asyncio.AbstractEventLoop
    timeout: float
    setting: str
    takes_returns: bool
    rejoin: Any
    watchers: set[asyncio.Task]
    came_back: asyncio.Event
    roster_changes: int
    holds_weights: Any

    def _watch(self, server: Server) -> str:
        """Watch the dropped ``server`` for its return; what will happen, said."""
        if not self.takes_returns or self.loop.is_closed():
            return ""
        server.returning, server.back = True, False

        def start() -> None:
            task = self.loop.create_task(self._await_return(server))
            self.watchers.add(task)
            task.add_done_callback(self.watchers.discard)

        self.loop.call_soon_threadsafe(start)
        if server.restarted_elsewhere:
            return "; process 0 restarts it"
        if server.restart is None:
            return "; it rejoins if it answers again"
        return f"; restarting it ({server.restarts_left} restart(s) left)" if server.restarts_left > 0 else ""

    def watch_returning(self) -> None:
        """Watch again every dropped server still expected back (after a cancel ended the watchers)."""
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
        """Until ``server`` is back, or its restarts are spent (``returning`` ends, its ``why`` says so)."""
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
                if not server.returning:  # given up elsewhere (process 0, for a server it restarts)
                    return
                try:
                    server.info = await self.request(server, "GET", "/grouprl/info", timeout=min(self.timeout, 10.0))
                    if not server.restarted_elsewhere or self.holds_weights(server):
                        server.back = True
                        self.came_back.set()
                        return
                except ServerFailure as failure:
                    if local and server.describe_exit and "exited" in server.describe_exit(0.0):
                        server.why += f"; restarted, then {server.describe_exit(0.0)}"
                        break
                    last = failure.what
                soon = local or server.restarted_elsewhere
                await asyncio.sleep(roster.READY_POLL_S if soon else roster.RETURN_POLL_S)
            else:
                server.why += f"; restarted, not ready within {self.timeout:g} s ({self.setting}; last: {last})"
            if server.stop is not None:
                server.stop()

    def back_servers(self) -> list[Server]:
        return [s for s in self.servers if s.back and not s.alive]

    def readmit(self, server: Server) -> None:
        server.alive, server.back, server.returning = True, False, False
        server.readmits += 1
        self.roster_changes += 1
        was, server.why = server.why, ""
        warnings.warn(f"rollout server {server.address} is back (dropped earlier: {was}); serving with "
                      f"{len(self.alive)} of {len(self.servers)} servers", stacklevel=2)

    async def rejoin_back(self) -> None:
        """Give every server that is back the current weights and readmit it; drop again one whose load fails."""
        for server in self.back_servers():
            try:
                await self.rejoin(server)
            except ServerFailure as failure:
                self.drop_again(server, f"back, then its weights failed to load: {failure.what}")
                continue
            self.readmit(server)

    async def _serving(self) -> list[Server]:
        """The servers serving; with none left, the first one the run restarts that comes back within the timeout
        (one the run did not start is not waited for)."""
        deadline = time.monotonic() + self.timeout
        while not self.alive and self.rejoin is not None and time.monotonic() < deadline \
                and any(s.returning and s.restarted_by_run for s in self.servers):  # one the run restarts
            await self.rejoin_back()
            if not self.alive:
                self.came_back.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.came_back.wait(), timeout=min(roster.READY_POLL_S, self.timeout))
        return self.living()
