"""The rollout servers as the trainer's pool sees them: each :class:`Server`'s state, the errors a request
to one raises, checked addresses, and how often the pool asks a server again."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

READY_POLL_S = 1.0
"""How often :meth:`~grouprl.serve.client.pool.ServerPool.wait_ready` asks a server that does not answer yet."""
EXIT_SETTLE_S = 2.0
"""How long a dropped local server's process is given to finish exiting, so the message names its exit status."""
RETURN_POLL_S = 10.0
"""How often a dropped server the run did not start is asked whether it answers again."""
SERVER_KEEP_ALIVE_S = 5
"""Seconds a rollout server keeps an idle connection open (``grouprl serve``'s, as vLLM's own server's
default)."""
IDLE_REUSE_S = SERVER_KEEP_ALIVE_S / 5
"""The longest a trainer leaves a connection idle and still sends on it. Well inside the server's keep-alive:
a request sent on a connection the server is closing fails as if the server had dropped it, and a healthy
server would be dropped (httpx's own limit is 5 s, the same as the server's, which races)."""


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
    restarted_elsewhere: bool = False
    """Started by the run in another trainer process (process 0), which restarts it and gives it the weights."""
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
    """Seconds with a request in flight since the busy clock was last read
    (:meth:`~grouprl.serve.client.pool.ServerPool.busy_shares`)."""
    busy_from: float = 0.0
    """When the current stretch of requests in flight (or the clock) started."""

    @property
    def restarted_by_run(self) -> bool:
        """Restarted by the run once dropped, here or by process 0."""
        return self.restart is not None or self.restarted_elsewhere

    @property
    def url(self) -> str:
        return f"http://{self.address}"


def parse_address(text: str, field: str = "rollout_servers") -> str:
    """``host:port`` checked (a port in 1..65535), or a ValueError naming ``field``."""
    host, sep, port = str(text).strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{field}: {text!r} is not host:port (e.g. 127.0.0.1:8000)")
    return f"{host}:{int(port)}"
