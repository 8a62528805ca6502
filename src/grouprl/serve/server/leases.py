"""A rollout server's collective weight transfers (``/grouprl/transfer/...``), each held under a lease, so a trainer
that goes away mid-transfer cannot leave the server paused with its weights lock held.

``start`` waits at most ``wait_s`` for the weights lock, pauses generation, starts vLLM's update and answers a token
that ``update`` and ``finish`` must carry (a stale trainer cannot finish another's transfer). The server then waits
at most ``lease_s`` for the holder's next call, counted from the end of its last; past it, or when an ``update``
fails, the transfer is abandoned: generation resumes, the lock is released, the weights are marked incomplete until
the next push, and late calls are refused saying why.
"""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from grouprl.serve.server.guard import Refusal
from grouprl.serve.server.pushes import version_refusal

REMEMBERED = 16  # abandoned transfers kept, to tell their late holders why they were refused


class TransferRefused(Refusal):
    """A transfer call the server refuses (a 409)."""

    def __init__(self, message: str):
        super().__init__(409, message)


@dataclass(eq=False)
class Holder:
    """The transfer that holds a server's weights lock."""

    token: str
    version: int
    lease_s: float
    deadline: float | None = None  # when the lease runs out; None while one of the holder's calls runs
    calls: int = 0
    last: str = "start"
    expiry: asyncio.Task | None = None


class Transfers:
    """The transfers of one server: ``state`` a :class:`~.routes.ServerState`, ``engine`` vLLM's engine client."""

    def __init__(self, state: Any, engine: Any, log: Callable[[str], None] = lambda line: print(line, flush=True),
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep):
        self.state, self.engine, self.log, self.clock, self.sleep = state, engine, log, clock, sleep
        self.holder: Holder | None = None
        self.abandoned: dict[str, tuple[Holder, str]] = {}
        self.tasks: set[asyncio.Task] = set()  # expiries and abandonments running (the loop keeps weak references)

    async def start(self, version: int, lease_s: float, wait_s: float, resume: bool = False) -> Holder:
        if not (0 < lease_s < math.inf):
            raise ValueError(f"lease_s must be a positive number of seconds, got {lease_s}")
        if not (0 <= wait_s < math.inf):
            raise ValueError(f"wait_s must be a number of seconds >= 0, got {wait_s}")
        try:
            async with asyncio.timeout(wait_s):  # a free lock is taken at once, even with wait_s 0
                await self.state.lock.acquire()
        except TimeoutError:
            raise TransferRefused(self._busy(version, wait_s)) from None
        if refusal := version_refusal(self.state.version, version, resume, log=self.log):
            self.state.lock.release()
            raise TransferRefused(f"start refused: {refusal}")
        self.holder = holder = Holder(secrets.token_hex(8), version, float(lease_s), calls=1)
        try:
            await self.engine.pause_generation(mode="wait")
            self.state.weights_complete = False  # vLLM's worker moves each layer out until it is loaded again
            await self.engine.start_weight_update()
        except BaseException:
            self.holder = None
            await self._resume()
            raise
        self._ended(holder)
        return holder

    async def update(self, token: str, receive: Callable[[], Awaitable[Any]]) -> None:
        holder = self._began(token, "update")
        try:
            await receive()
        except BaseException as e:
            await self._abandon(holder, f"its update failed ({type(e).__name__}: {e})")
            raise
        self._ended(holder)

    async def finish(self, token: str) -> int:
        holder = self._began(token, "finish")
        self.holder = None
        try:
            await self.engine.finish_weight_update()
            await self.engine.reset_prefix_cache()
            await self.engine.update_weight_version(str(holder.version))
            self.state.version, self.state.adapter = holder.version, None  # whole weights: no adapter on top
            self.state.weights_complete, self.state.broken = True, None
        finally:
            await self._resume()
        return holder.version

    async def abort(self, token: str, why: str) -> bool:
        """Abandon the transfer of ``token`` unless a call of it runs (that one fails with the trainer's group);
        whether it was."""
        holder = self.holder
        if holder is None or not secrets.compare_digest(holder.token, str(token)) or holder.calls:
            return False
        self._stop_expiry(holder)
        await self._abandon(holder, f"its trainer gave it up ({why})")
        return True

    # -- the lease ----------------------------------------------------------------------------------
    def _began(self, token: str, call: str) -> Holder:
        holder = self.holder
        if holder is None or not secrets.compare_digest(holder.token, str(token)):
            raise TransferRefused(self._refusal(token, call))
        holder.calls += 1
        holder.deadline, holder.last = None, call
        self._stop_expiry(holder)
        return holder

    @staticmethod
    def _stop_expiry(holder: Holder) -> None:
        if holder.expiry is not None:
            holder.expiry.cancel()
            holder.expiry = None

    def _ended(self, holder: Holder) -> None:
        holder.calls -= 1
        if self.holder is holder and holder.calls == 0:
            holder.deadline = self.clock() + holder.lease_s
            holder.expiry = asyncio.get_running_loop().create_task(self._expire(holder))
            self.tasks.add(holder.expiry)
            holder.expiry.add_done_callback(self.tasks.discard)

    async def _expire(self, holder: Holder) -> None:
        await self.sleep(max(holder.deadline - self.clock(), 0.0))  # the task starts a moment after the deadline
        holder.expiry = None  # from here on nothing cancels this task: the abandonment runs whole
        if self.holder is holder and holder.calls == 0:
            await self._abandon(holder, f"the lease expired after {holder.lease_s:g} s without a call from its "
                                        f"trainer (its last: {holder.last})")

    async def _abandon(self, holder: Holder, why: str) -> None:
        if self.holder is not holder:
            return
        self.holder = None
        self.abandoned[holder.token] = (holder, why)
        while len(self.abandoned) > REMEMBERED:
            self.abandoned.pop(next(iter(self.abandoned)))
        problem = ""
        try:  # vLLM's worker refuses a new update while this one is open; layers not received keep their values
            await self.engine.finish_weight_update()
            await self.engine.reset_prefix_cache()
        except Exception as e:  # noqa: BLE001 - said in the line below; generation resumes regardless
            problem = f"; closing its update failed ({type(e).__name__}: {e})"
        finally:
            self.state.weights_complete = False
            await self._resume()
        self.log(f"grouprl serve: weight transfer {holder.token} (version {holder.version}) abandoned: {why}{problem}; "
                 f"generation resumed with incomplete weights (version {self.state.version} stays the last complete "
                 "one) until the next push")

    async def _resume(self) -> None:
        try:
            await self.engine.resume_generation()
        finally:
            if self.state.lock.locked():
                self.state.lock.release()

    def _refusal(self, token: str, call: str) -> str:
        if token in self.abandoned:
            holder, why = self.abandoned[token]
            return (f"{call} refused: this server abandoned weight transfer {token} (version {holder.version}): "
                    f"{why}; start a new one")
        if self.holder is not None:
            return (f"{call} refused: weight transfer {token} is not the one this server holds (another trainer's, "
                    f"version {self.holder.version})")
        return f"{call} refused: this server holds no weight transfer {token} (POST /grouprl/transfer/start first)"

    def _busy(self, version: int, wait_s: float) -> str:
        holder, said = self.holder, f"the start of version {version} waited {wait_s:g} s (its wait_s) for"
        if holder is None:
            return f"{said} this server's weights, which another load holds (a folder push or a transfer's start)"
        if holder.deadline is None:
            return (f"{said} the weight transfer of version {holder.version}, whose {holder.last} is running "
                    f"(its lease of {holder.lease_s:g} s starts again when that call ends)")
        left = max(holder.deadline - self.clock(), 0.0)
        return (f"{said} the weight transfer of version {holder.version}, which holds this server for {left:.1f} s "
                f"more of its {holder.lease_s:g} s lease")
