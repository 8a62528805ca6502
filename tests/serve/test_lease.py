"""The lease over a server's collective weight transfers (grouprl.serve.server.leases), without vLLM: the engine is
an object that records which of vLLM's engine-client calls the server made, and the lease's time is a clock
the test moves by hand (no test here waits on the wall clock). tests/serve/test_lease_server.py runs the same
story on a real CPU server."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field

import pytest

from grouprl.serve.server.leases import REMEMBERED, TransferRefused, Transfers


@dataclass
class State:
    """The fields of a ServerState the lease reads and writes."""

    version: int | None = 0
    adapter: str | None = None
    weights_complete: bool = True
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Engine:
    """Records the engine-client calls made, in order; ``fail`` names one that raises."""

    def __init__(self, fail: str = ""):
        self.calls: list[str] = []
        self.fail = fail

    def __getattr__(self, name: str):
        async def call(*args, **kwargs):
            self.calls.append(name if not args else f"{name}({args[0]})")
            if name == self.fail:
                raise RuntimeError(f"{name} broke")
        return call


class Clock:
    """Time that moves only when the test says."""

    def __init__(self):
        self.now = 0.0
        self.sleepers: list[tuple[float, asyncio.Future]] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        wake = asyncio.get_running_loop().create_future()
        self.sleepers.append((self.now + seconds, wake))
        await wake

    async def advance(self, seconds: float) -> None:
        self.now += seconds
        for _ in range(10):  # wake the sleepers due, let them run to their next wait, again
            for due, wake in self.sleepers:
                if due <= self.now and not wake.done():
                    wake.set_result(None)
            self.sleepers = [(d, w) for d, w in self.sleepers if not w.done()]
            await asyncio.sleep(0)


def setup(fail: str = "") -> tuple[Transfers, State, Engine, Clock, list[str]]:
    state, engine, clock, lines = State(), Engine(fail), Clock(), []
    return Transfers(state, engine, log=lines.append, clock=clock, sleep=clock.sleep), state, engine, clock, lines


PAUSE, START = "pause_generation", "start_weight_update"
CLOSE = ["finish_weight_update", "reset_prefix_cache"]


def test_a_finished_transfer_sets_its_version_and_each_call_restarts_the_lease():
    async def story():
        transfers, state, engine, clock, lines = setup()
        holder = await transfers.start(1, lease_s=3.0, wait_s=0.0)
        assert engine.calls == [PAUSE, START] and state.lock.locked()
        assert state.weights_complete is False  # vLLM's worker has begun to take the layers out
        await clock.advance(2.5)  # 2.5 s of the 3 s lease gone
        await transfers.update(holder.token, Engine().update_weights)
        await clock.advance(2.5)  # 5 s since the start, 2.5 s since the update: the lease counts from the update
        assert transfers.holder is holder
        assert await transfers.finish(holder.token) == 1
        assert engine.calls == [PAUSE, START, *CLOSE, "update_weight_version(1)", "resume_generation"]
        assert (state.version, state.weights_complete, state.lock.locked()) == (1, True, False)
        await clock.advance(100.0)  # no lease is left to expire
        assert lines == [] and engine.calls[-1] == "resume_generation"

    asyncio.run(story())


def test_a_holder_that_goes_away_is_abandoned_after_its_lease_and_its_late_calls_are_refused():
    async def story():
        transfers, state, engine, clock, lines = setup()
        holder = await transfers.start(1, lease_s=3.0, wait_s=0.0)
        await clock.advance(2.9)
        assert transfers.holder is holder and state.lock.locked()
        await clock.advance(0.1)  # 3 s without a call
        assert transfers.holder is None and not state.lock.locked()
        # the update session closed (vLLM refuses a new one while it is open), generation resumed, no version set
        assert engine.calls == [PAUSE, START, *CLOSE, "resume_generation"]
        assert (state.version, state.weights_complete) == (0, False)
        assert len(lines) == 1 and holder.token in lines[0] and "version 1" in lines[0], lines
        assert "lease expired after 3 s" in lines[0] and "version 0 stays the last complete" in lines[0], lines
        for late in (transfers.finish(holder.token), transfers.update(holder.token, Engine().update_weights)):
            with pytest.raises(TransferRefused, match=r"abandoned .* the lease expired after 3 s"):
                await late
        assert engine.calls == [PAUSE, START, *CLOSE, "resume_generation"]  # the late calls did nothing
        again = await transfers.start(2, lease_s=3.0, wait_s=0.0)  # the next trainer takes the server at once
        assert again.token != holder.token
        await transfers.finish(again.token)
        assert (state.version, state.weights_complete) == (2, True)

    asyncio.run(story())


def test_a_start_while_another_lease_is_live_waits_its_own_wait_then_names_the_lease_left():
    async def story():
        transfers, state, engine, clock, lines = setup()
        first = await transfers.start(1, lease_s=10.0, wait_s=0.0)
        await clock.advance(4.0)
        with pytest.raises(TransferRefused, match=r"version 2 waited 0.01 s .* for 6.0 s more of its 10 s lease"):
            await transfers.start(2, lease_s=10.0, wait_s=0.01)
        assert transfers.holder is first and engine.calls == [PAUSE, START]  # the refused start touched nothing
        with pytest.raises(TransferRefused, match="not the one this server holds"):
            await transfers.finish("stale-token")
        assert transfers.holder is first and state.lock.locked()
        waiting = asyncio.ensure_future(transfers.start(2, lease_s=10.0, wait_s=60.0))
        await clock.advance(0.0)
        await transfers.finish(first.token)  # the lock goes to the start that waits
        second = await waiting
        assert transfers.holder is second and state.version == 1

    asyncio.run(story())


def test_no_lease_runs_out_while_a_call_of_its_holder_runs():
    async def story():
        transfers, state, engine, clock, lines = setup()
        holder = await transfers.start(1, lease_s=3.0, wait_s=0.0)
        arrived = asyncio.Event()
        update = asyncio.ensure_future(transfers.update(holder.token, arrived.wait))  # a broadcast under way
        await clock.advance(50.0)
        assert transfers.holder is holder and lines == []
        with pytest.raises(TransferRefused, match="whose update is running"):
            await transfers.start(2, lease_s=3.0, wait_s=0.0)
        arrived.set()
        await update
        await clock.advance(3.0)  # 3 s after the update ended
        assert transfers.holder is None and "its last: update" in lines[0], lines

    asyncio.run(story())


def test_a_failed_update_abandons_the_transfer_and_a_failed_start_lets_go():
    async def story():
        transfers, state, engine, clock, lines = setup()
        holder = await transfers.start(1, lease_s=3.0, wait_s=0.0)

        async def broken():
            raise ConnectionResetError("the trainer went away")

        with pytest.raises(ConnectionResetError):
            await transfers.update(holder.token, broken)
        assert engine.calls == [PAUSE, START, *CLOSE, "resume_generation"] and not state.lock.locked()
        assert "its update failed (ConnectionResetError: the trainer went away)" in lines[0], lines
        with pytest.raises(TransferRefused, match="update failed"):
            await transfers.finish(holder.token)

        transfers, state, engine, clock, lines = setup(fail=START)
        with pytest.raises(RuntimeError, match="start_weight_update broke"):
            await transfers.start(1, lease_s=3.0, wait_s=0.0)
        assert engine.calls == [PAUSE, START, "resume_generation"] and not state.lock.locked()
        assert transfers.holder is None
        with pytest.raises(TransferRefused, match="holds no weight transfer"):
            await transfers.finish("anything")

    asyncio.run(story())


def test_an_abandonment_that_cannot_close_the_update_still_resumes_and_says_why():
    async def story():
        transfers, state, engine, clock, lines = setup(fail="finish_weight_update")
        await transfers.start(1, lease_s=1.0, wait_s=0.0)
        await clock.advance(1.0)
        assert engine.calls == [PAUSE, START, "finish_weight_update", "resume_generation"]
        assert not state.lock.locked() and state.weights_complete is False
        assert "closing its update failed (RuntimeError: finish_weight_update broke)" in lines[0], lines

    asyncio.run(story())


def test_only_the_last_abandoned_transfers_are_remembered():
    async def story():
        transfers, state, engine, clock, lines = setup()
        tokens = []
        for v in range(REMEMBERED + 1):
            tokens.append((await transfers.start(v + 1, lease_s=1.0, wait_s=0.0)).token)
            await clock.advance(1.0)
        assert len(lines) == REMEMBERED + 1 and list(transfers.abandoned) == tokens[1:]
        with pytest.raises(TransferRefused, match="holds no weight transfer"):  # the oldest is forgotten
            await transfers.finish(tokens[0])

    asyncio.run(story())


@pytest.mark.parametrize("lease, wait", [(0.0, 1.0), (-1.0, 1.0), (math.inf, 1.0), (math.nan, 1.0), (1.0, -1.0),
                                         (1.0, math.inf)])
def test_a_lease_or_wait_that_is_not_a_finite_number_of_seconds_is_refused_before_the_lock(lease, wait):
    async def story():
        transfers, state, engine, clock, lines = setup()
        with pytest.raises(ValueError, match="lease_s|wait_s"):
            await transfers.start(1, lease_s=lease, wait_s=wait)
        assert engine.calls == [] and not state.lock.locked()

    asyncio.run(story())


def test_the_trainer_aborts_a_transfer_it_cannot_complete_once_no_call_of_it_runs():
    async def story():
        transfers, state, engine, clock, lines = setup()
        holder = await transfers.start(1, lease_s=3.0, wait_s=0.0)
        assert not await transfers.abort("not-its-token", "a member died")  # another's token: nothing
        release = asyncio.Event()

        async def receive():  # an update waiting in the broadcast
            await release.wait()
            raise RuntimeError("Connection reset by peer")

        update = asyncio.create_task(transfers.update(holder.token, receive))
        await asyncio.sleep(0)
        assert not await transfers.abort(holder.token, "a member died")  # its update runs: it ends the transfer
        assert state.lock.locked() and lines == []
        release.set()
        with pytest.raises(RuntimeError, match="Connection reset"):
            await update
        assert not state.lock.locked() and "its update failed (RuntimeError: Connection reset by peer)" in lines[0]

        holder = await transfers.start(2, lease_s=3.0, wait_s=0.0)  # started, and nothing more came
        engine.calls.clear()
        assert await transfers.abort(holder.token, "127.0.0.1:8001 died")
        assert engine.calls == [*CLOSE, "resume_generation"] and not state.lock.locked()
        assert "abandoned: its trainer gave it up (127.0.0.1:8001 died)" in lines[1]
        assert state.version == 0 and not state.weights_complete  # the last complete version stays
        await clock.advance(10.0)  # the lease's expiry was cancelled: nothing more is logged
        assert len(lines) == 2
        with pytest.raises(TransferRefused, match="its trainer gave it up"):
            await transfers.finish(holder.token)

    asyncio.run(story())
