"""Reward services for the tests of grouprl.rewards.remote: the example service (examples/reward-service/app.py)
started on loopback in a process of its own, and a scripted stub served from a thread of the test process."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

APP = Path(__file__).resolve().parents[2] / "examples" / "reward-service" / "app.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Started:
    url: str
    """http://127.0.0.1:PORT, without a route."""
    process: subprocess.Popen


@contextlib.contextmanager
def example_service(token: str | None, wait_s: float = 120.0) -> Iterator[Started]:
    """The example service on a free loopback port, asking for ``token``; killed on leaving."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "GROUPRL_REWARD_TOKEN"}
    if token:
        env["GROUPRL_REWARD_TOKEN"] = token
    process = subprocess.Popen([sys.executable, str(APP), "--port", str(port)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + wait_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the example service exited: {process.stderr.read().decode()[-2000:]}")
            try:
                httpx.get(f"{url}/docs", timeout=2)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield Started(url, process)
    finally:
        process.kill()
        process.wait()


@dataclass
class Stub:
    """Answers each POST with the next of ``script``: (status, body) pairs, or a function of the request's JSON
    returning one; the last one repeats. ``requests`` holds the JSON bodies received."""

    script: list
    delay_s: float = 0.0
    requests: list = field(default_factory=list)


@contextlib.contextmanager
def stub_service(stub: Stub) -> Iterator[str]:
    """``stub`` served on a free loopback port from a thread; yields its URL (route /score)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the name http.server calls
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            stub.requests.append(body)
            answer = stub.script[min(len(stub.requests), len(stub.script)) - 1]
            status, reply = answer(body) if isinstance(answer, Callable) else answer
            time.sleep(stub.delay_s)
            data = json.dumps(reply).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up waiting

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/score"
    finally:
        server.shutdown()
        server.server_close()
