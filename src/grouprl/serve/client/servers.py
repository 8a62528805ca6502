"""The rollout servers as the trainer's pool sees them: :class:`Server`, the errors, addresses and poll periods."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

READY_POLL_S = 1.0
EXIT_SETTLE_S = 2.0  # a dropped local server is given this long to exit, so the message names its exit status
SERVER_KEEP_ALIVE_S = 5  # a server keeps an idle connection this long (vLLM's default)
# The longest a trainer reuses an idle connection: well inside the server's keep-alive, since a request on a
# connection being closed would drop a healthy server (httpx's default equals the server's, which races).
IDLE_REUSE_S = SERVER_KEEP_ALIVE_S / 5


class RolloutServerError(ConnectionError):
    """No rollout server can serve the run, or a server refused a request."""


class ServerFailure(Exception):
    """One server failed one request: the pool drops it and retries elsewhere."""

    def __init__(self, server: Server, what: str):
        super().__init__(f"{server.address}: {what}")
        self.server, self.what = server, what


@dataclass(eq=False)
class Server:
    """One rollout server as the trainer sees it."""

    address: str
    alive: bool = True
    why: str = ""  # what failed, once dropped
    adapter: str | None = None  # the LoRA adapter's name (a request's ``model``); None: the base weights
    version: int | None = None
    info: dict[str, Any] | None = None
    # a server started here: its process's state for messages (given seconds to settle), the end of its processes
    describe_exit: Callable[[float], str] | None = None
    stop: Callable[[], None] | None = None
    in_flight: int = 0
    busy_s: float = 0.0  # seconds with a request in flight since the busy clock was last read
    busy_from: float = 0.0

    @property
    def url(self) -> str:
        return f"http://{self.address}"


def parse_address(text: str, field: str = "rollout_servers") -> str:
    """``host:port`` checked (a port in 1..65535), or a ValueError naming ``field``."""
    host, sep, port = str(text).strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{field}: {text!r} is not host:port (e.g. 127.0.0.1:8000)")
    return f"{host}:{int(port)}"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
