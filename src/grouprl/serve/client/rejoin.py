"""A dropped rollout server coming back, the part of :class:`~grouprl.serve.client.pool.ServerPool` that watches for it.

When the pool is told to take them back (``takes_returns``), a dropped server is watched on the pool's loop.
One started by the run is restarted (its ``restart``, while ``restarts_left``); any other is asked every
:data:`~grouprl.serve.client.servers.RETURN_POLL_S` seconds whether it answers again. One that answers is *back*
(:meth:`Returns.back_servers`): at the sampler's next weight sync it is given the current weights and put back
in the rotation: through ``rejoin`` (the files transport, :meth:`Returns.rejoin_back`), or as a member of the
group the next push forms (a collective transport). With ``rejoin``, a rollout that finds no server left waits
for one the run is restarting (up to the timeout) and loads its weights itself: no push can run meanwhile, as
the pushing thread is the one waiting on the rollout. In a trainer process other than 0, a server process 0
started is :attr:`~grouprl.serve.client.servers.Server.restarted_elsewhere`: it is back once it answers holding the
weights this process samples with (``holds_weights``: process 0 restarted it and gave them), and ``rejoin``
takes it back without loading anything; once process 0 gives up on it (its restarts spent), the next push's
broadcast says so and it is no longer asked after.
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
    """:class:`~.pool.ServerPool`'s returns (a part of it: it reads the pool's ``servers``, ``loop``,
    ``timeout``, ``setting``, ``takes_returns``, ``rejoin``, ``holds_weights``, ``watchers``, ``came_back``,
    ``roster_changes`` and calls its ``request``, ``alive`` and ``living``)."""

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
        """Watch the dropped ``server`` for its return (where the pool takes returns); what will happen, said."""
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
        timeout, its weights loaded here, or by process 0 for a server process 0 restarts (see the module
        docstring). A server the run did not start is not waited for: someone has to start it again."""
        deadline = time.monotonic() + self.timeout
        while not self.alive and self.rejoin is not None and time.monotonic() < deadline \
                and any(s.returning and s.restarted_by_run for s in self.servers):  # one the run restarts
            await self.rejoin_back()
            if not self.alive:
                self.came_back.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.came_back.wait(), timeout=min(roster.READY_POLL_S, self.timeout))
        return self.living()
