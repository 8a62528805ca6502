"""The trainer's side of the collective transports (``nccl``, ``gloo``): weights broadcast from the trainer (rank 0)
to every worker of every server in one group, through vLLM's weight-transfer engines. A failed push is aborted, the
group torn down, the silent servers dropped and the push made again; the group is formed again after any change."""

from __future__ import annotations

import concurrent.futures
import itertools
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import torch
from torch import nn

from grouprl.serve.client.servers import RolloutServerError, Server, ServerFailure, free_port
from grouprl.serve.weights.sent import LiveWeights, StagedWeights, StreamedWeights, staged_copy

JOIN_POLL_S = 0.2


def reachable_address(address: str) -> str:
    """This machine's address on the route to ``address`` (a UDP connect sends nothing; it picks the interface)."""
    host, _, port = address.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, int(port)))
        return str(s.getsockname()[0])


def rank_offsets(workers: list[int]) -> list[int]:
    """Each server's first rank in the group: rank 0 is the trainer, then each server's workers in turn."""
    if any(n < 1 for n in workers):
        raise ValueError(f"a rollout server reported {min(workers)} workers")
    return list(itertools.accumulate([1, *workers[:-1]]))


class ServersClient:
    """vLLM's ``VLLMWeightSyncClient`` over grouprl's routes of several servers at once."""

    def __init__(self, pool: Any, servers: list[Server]):
        self.pool, self.servers = pool, servers
        self.tokens: dict[str, str] = {}  # host:port -> the token its start answered
        workers = [int(s.info.get("workers") or 1) for s in servers]
        self.offsets, self.world_size = rank_offsets(workers), 1 + sum(workers)
        self.version, self.resume = 0, False  # resume: the push restarts a run
        self.joined: set[str] = set()
        self.failed: dict[str, str] = {}
        self.broken: set[str] = set()  # whose join failed on the wire (a reset, a 5xx), not by refusal or timeout
        self.late: set[str] = set()

    def _all(self, path: str, body: Callable[[Server], dict[str, Any]], timeout: float | None = None) -> None:
        """POST ``body(server)`` to every server at once; each answer's token or version kept as it comes."""
        async def one(server: Server) -> None:
            try:
                answer = await self.pool.request(server, "POST", path, body(server), timeout=timeout)
            except ServerFailure as e:
                raise RolloutServerError(f"rollout server {server.address}: {e.what}") from e
            if "token" in answer:
                self.tokens[server.address] = str(answer["token"])
            if path.endswith("/finish"):
                server.version, server.adapter = answer.get("version"), None

        for outcome in self.pool.gather([one(s) for s in self.servers]):
            if isinstance(outcome, BaseException):
                raise outcome

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        async def one(server: Server, i: int) -> None:
            body = {"init_info": {**init_info, "rank_offset": self.offsets[i]}}
            await self.pool.request(server, "POST", "/grouprl/transfer/init", body)
            self.joined.add(server.address)

        outcomes = self.pool.gather([one(s, i) for i, s in enumerate(self.servers)])
        for server, outcome in zip(self.servers, outcomes):
            if isinstance(outcome, ServerFailure) and isinstance(outcome.__cause__, httpx.TimeoutException):
                self.late.add(server.address)  # named as not joined in time, as at the trainer's own deadline
            elif isinstance(outcome, ServerFailure):
                self.failed[server.address] = outcome.what
                self.broken.add(server.address)
            elif isinstance(outcome, BaseException):
                self.failed[server.address] = str(outcome)

    def start_weight_update(self) -> None:
        lease = self.pool.timeout  # the wait for another lease, then the pause, each bounded by the timeout
        self.tokens.clear()
        # a push made again after a member failed at its finish: the others hold this version, and taking it again
        # is no step back
        self._all("/grouprl/transfer/start", lambda s: {"version": self.version, "lease_s": lease, "wait_s": lease,
                                                        "resume": self.resume or s.version == self.version},
                  timeout=2 * lease)

    def update_weights(self, update_info: Any) -> None:
        self._all("/grouprl/transfer/update", lambda s: {"token": self.tokens[s.address], "update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all("/grouprl/transfer/finish", lambda s: {"token": self.tokens[s.address]})
        for server in self.servers:
            server.version, server.adapter = self.version, None

    def abort(self, why: str) -> None:
        """Give up the transfer on every server that started it (failures ignored: the group is torn down next)."""
        self.pool.gather([self.pool.request(s, "POST", "/grouprl/transfer/abort",
                                            {"token": self.tokens[s.address], "why": why})
                          for s in self.servers if s.alive and s.address in self.tokens])
        self.tokens.clear()

    def silent(self) -> list[tuple[Server, str]]:
        """The members that do not answer ``/grouprl/info``, each with what failed."""
        outcomes = self.pool.gather([self.pool.info(s) for s in self.servers])
        if other := [o for o in outcomes if isinstance(o, BaseException) and not isinstance(o, ServerFailure)]:
            raise other[0]
        return [(s, o.what) for s, o in zip(self.servers, outcomes) if isinstance(o, ServerFailure)]

    def shutdown(self) -> None:
        """Ask every server to leave the group (failures ignored: the group is gone either way)."""
        self.pool.gather([self.pool.request(s, "POST", "/grouprl/transfer/shutdown", {})
                          for s in self.servers if s.alive])


class CollectiveWeights:
    """The trainer's sender over vLLM's ``backend`` (nccl, gloo) to the servers of ``pool``. ``init_info``: (rendezvous
    host, port, group size, timeout) -> vLLM's trainer init info; ``timeout``: seconds the servers may take to join
    (``setting`` names it); ``stages``: whether a push sends a copy made at the write (else the model, read live)."""

    def __init__(self, pool: Any, backend: str, init_info: Callable[[str, int, int, float], Any], timeout: float,
                 setting: str = "rollout_server_timeout", stages: Callable[[], bool] = lambda: True):
        self.pool, self.backend, self.init_info, self.stages = pool, backend, init_info, stages
        self.timeout, self.setting = float(timeout), setting
        for s in pool.alive:
            held = s.info.get("weight_transfer")
            if held != backend:
                raise RolloutServerError(f"rollout server {s.address} takes weights over {held or 'files only'}, "
                                         f"not {backend}: start it with --rollout_weights_transport {backend}")
        self.engine: Any = None
        self.client: ServersClient | None = None
        self.sending: StagedWeights | LiveWeights | StreamedWeights = StagedWeights([])
        self.version, self.resume = 0, True  # resume: the next push is this trainer's first, (re)starting a run
        self._join()

    def _join(self, again: bool = True) -> None:
        """Form the group with the living servers, or a RolloutServerError naming each that did not join in time. A
        server whose join failed on the wire and no longer answers is dropped and the group formed without it; if
        each such server still answers (a reset connection), the group is formed once more (``again``)."""
        from vllm.distributed.weight_transfer import WeightTransferTrainerFactory

        servers = self.pool.living()
        client = ServersClient(self.pool, servers)
        host = reachable_address(servers[0].address)
        info = self.init_info(host, free_port(host), client.world_size, self.timeout)
        done: concurrent.futures.Future = concurrent.futures.Future()

        def join() -> None:
            try:
                done.set_result(WeightTransferTrainerFactory.trainer_init(info, client=client, source=self))
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                done.set_exception(e)

        threading.Thread(target=join, name="grouprl-weights-join", daemon=True).start()
        deadline = time.monotonic() + self.timeout
        while not done.done() and not client.failed and not client.late and time.monotonic() < deadline:
            time.sleep(JOIN_POLL_S)
        if client.failed or client.late or not done.done():
            self.pool.cancel()  # the join requests still waiting end, and with them vLLM's thread that made them
            said = "; ".join(f"{a}: {why}" for a, why in client.failed.items())
            late = [s.address for s in servers if s.address not in client.joined and s.address not in client.failed]
            late_said = (f"{', '.join(late)} did not join within {self.timeout:g} s ({self.setting})") if late else ""
            whys = "; ".join(x for x in (said, late_said) if x)
            failure = RolloutServerError(f"the {self.backend} weight-transfer group (trainer at {host}:"
                                         f"{info.master_port}) did not form: {whys}")
            broken = [s for s in servers if s.address in client.broken]
            if late or not broken or len(broken) < len(client.failed):  # a refusal or a timeout is not retried
                raise failure
            gone = ServersClient(self.pool, broken).silent()
            for server, why in gone:
                self.pool.drop(ServerFailure(server, f"it stopped answering while the weight-transfer group formed "
                                                     f"({client.failed[server.address]}; then {why})"))
            if not gone and not again:
                raise failure
            ServersClient(self.pool, [s for s in broken if s.alive]).shutdown()  # a half-made join is undone
            return self._join(again=again and bool(gone))
        self.engine, self.client, self.roster = done.result(), client, self.pool.roster_changes

    def write(self, model: nn.Module, read: Any, version: int, dtype: torch.dtype) -> None:
        """What the next push sends as ``version``: a copy of ``read`` where :attr:`stages` says so, else the model."""
        if self.stages():  # each tensor cast (and copied, if the model's own) as it is read
            self.sending = StagedWeights(staged_copy(model, dtype, read.tensors))
        else:
            self.sending = LiveWeights(model, dtype)
        self.version = version

    def push(self) -> None:
        while not self._push_once():  # a member that stopped answering was dropped: again without it
            pass

    def stream(self, read: Any, version: int, dtype: torch.dtype) -> bool:
        """Push ``version`` from ``read`` as it is sent, once: False when a member was dropped mid-way."""
        self.sending, self.version = StreamedWeights(read, dtype), version
        return self._push_once()

    def _push_once(self) -> bool:
        """One attempt at a push: True once sent; False when a member that stopped answering was dropped."""
        # a server dropped (its workers would never receive), or a failed push tore the group down
        if self.roster != self.pool.roster_changes or self.engine is None:
            self.close()
            self._join()
        self.client.version, self.client.resume = self.version, self.resume
        try:
            self.engine.send_weights()
        except Exception as e:  # noqa: BLE001 - a member that died is dropped and the push made again without it
            what = f"{type(e).__name__}: {e}"
            self.client.abort(what)  # the servers that hold the transfer idle resume at once
            silent = self.client.silent()
            if not silent:
                raise
            # the traceback holds the broadcast's frames and through them the group: freed before the group is torn
            # down, or the living servers' workers would wait in the broadcast until gloo's timeout
            e.__traceback__ = None
        else:
            self.sending, self.resume = StagedWeights([]), False  # a staged copy's memory back
            return True
        self.close()  # a living server's update waiting in the broadcast fails with the group and is abandoned
        for server, why in silent:
            self.pool.drop(ServerFailure(server, f"it stopped answering during a weight push ({why}; the push: "
                                                 f"{what[:300]})"))
        return False

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.client.shutdown()
            self.engine = None

    # vLLM's ``WeightSource``: what :meth:`write` made ready last
    def metadata(self) -> list[Any]:
        from vllm.distributed.weight_transfer.base import ParamMeta

        return [ParamMeta(n, dtype, shape) for n, dtype, shape in self.sending.metadata()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.sending)

    def held_names(self) -> None:
        return None
