"""The pool's busy clock (``server/<i>/busy``) on a clock the test moves by hand: no server is asked anything."""

from __future__ import annotations

import pytest

from grouprl.serve.client import pool as pool_module
from grouprl.serve.client.pool import ServerPool


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(pool_module.time, "monotonic", c)
    return c


def test_each_servers_busy_share_is_its_time_with_a_request_in_flight(clock):
    pool = ServerPool(["127.0.0.1:1", "127.0.0.1:2"], timeout=5)
    try:
        a, b = pool.servers
        for at, server, change in [(1, a, +1), (2, a, +1), (2, b, +1), (3, a, -1), (3.5, a, -1), (4, a, +1)]:
            clock.now = at
            pool._clock(server, change)
        clock.now = 5.0
        # a: in flight from 1 to 3.5 (two requests overlap from 2 to 3: counted once) and from 4 on: 2.5 + 1 = 3.5
        # of 5 s; b: from 2 on: 3 of 5
        assert pool.busy_shares() == pytest.approx([0.7, 0.6])
        clock.now = 7.0
        pool._clock(b, -1)
        clock.now = 9.0
        # the clock restarted at 5: a still in flight, 4 of 4; b done at 7, 2 of 4
        assert pool.busy_shares() == pytest.approx([1.0, 0.5])
    finally:
        pool.close()
