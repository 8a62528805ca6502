"""Forming the weight-transfer group when a server's join fails on the wire: a server that no longer answers is
dropped and named, one that still answers (a reset connection) is asked to join once more, after its half-made
join is undone; a refusal or a timeout is not retried. Fake servers: they answer ``/grouprl/info`` as a server of
the tiny model would and never join the group itself, so each run ends with the error the trainer raises."""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import struct
import time
from http.server import ThreadingHTTPServer

import pytest

from grouprl.models import tiny_causal_lm
from tests.helpers.servers import FakeServer, JsonHandler, tiny_server_info

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="the group is formed by vLLM's trainer engine")]


class ResettingServer(FakeServer):
    """Resets the connection of its first ``resets`` joins (no answer; with ``dies``, it answers nothing more from
    then on); later joins wait ``join_s`` seconds. ``posts`` lists the paths posted, in order."""

    def __init__(self, resets=1, dies=False, join_s=30.0):
        info = tiny_server_info("gloo")
        self.posts: list[str] = []
        self.dead = False
        fake = self

        class Handler(JsonHandler):
            def reset(self):
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
                self.close_connection = True

            def do_GET(self):
                if fake.dead:
                    return self.reset()
                self.reply(info)

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                fake.posts.append(self.path)
                if fake.dead:
                    return self.reset()
                if self.path.endswith("/transfer/init"):
                    if fake.posts.count(self.path) <= resets:
                        fake.dead = dies
                        return self.reset()
                    time.sleep(join_s)
                with contextlib.suppress(OSError):  # the trainer may have given up and closed the connection
                    self.reply({})

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # a reset connection's handler fails writing to it; that is the point

        super().__init__(Handler, Server)


def sampler_error(server, timeout=3):
    from grouprl.serve.client.server_sampler import ServerSampler
    from grouprl.serve.client.servers import RolloutServerError

    model, tok = tiny_causal_lm()
    try:
        with pytest.raises(RolloutServerError) as e:
            ServerSampler(model, tok, [server.address], timeout=timeout, transport="gloo")
    finally:
        server.close()
    return str(e.value)


def test_a_reset_join_is_undone_and_made_once_more_and_a_timeout_then_is_not_retried():
    server = ResettingServer(resets=1, join_s=30.0)
    said = sampler_error(server)
    assert server.posts == ["/grouprl/transfer/init", "/grouprl/transfer/shutdown", "/grouprl/transfer/init"]
    # the second join times out, named alike whether the trainer's deadline or the request's came first
    assert said.endswith(f"did not form: {server.address} did not join within 3 s (rollout_server_timeout)"), said


def test_two_reset_joins_of_a_server_that_still_answers_are_raised_naming_the_failure():
    server = ResettingServer(resets=2)
    said = sampler_error(server)
    assert server.posts.count("/grouprl/transfer/init") == 2
    assert said.startswith("the gloo weight-transfer group (trainer at 127.0.0.1:")
    assert f"{server.address}: POST /grouprl/transfer/init failed: " in said, said


def test_a_server_that_stops_answering_at_its_join_is_dropped_and_named():
    server = ResettingServer(resets=1, dies=True)
    said = sampler_error(server)
    assert server.posts == ["/grouprl/transfer/init"]  # nothing more is asked of a server that no longer answers
    assert said.startswith(f"no rollout server is left ({server.address}: it stopped answering while the "
                           "weight-transfer group formed (POST /grouprl/transfer/init failed: "), said
