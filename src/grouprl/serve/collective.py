"""The trainer's side of the collective transports (``nccl``, ``gloo``): weights broadcast from the
trainer (rank 0) to every worker of every rollout server in one group, through vLLM's own weight-transfer
engines (``vllm.distributed.weight_transfer``: its trainer engine drives the round trip, its workers
receive and reload layer by layer). Nothing touches storage.

- Joining: at start the trainer opens a rendezvous (a TCP store on a free port of the address it reaches the
  first server from) and asks each server to join it (``POST /grouprl/transfer/init``) at its own rank
  offset: the group is rank 0 (the trainer) then server 0's workers, server 1's, ... A server that has not
  joined within ``rollout_server_timeout`` is named with that timeout. The group is formed again, without
  it, once a server has been dropped, and with it at the first push after it came back
  (:mod:`grouprl.serve.pool`); a server back that fails to join is dropped again and the group formed without it.
  A push that fails is given up on every server that started it (``/grouprl/transfer/abort``), the group torn
  down, and the servers that no longer answer dropped; the push is then made again without them.
- A push: the trainer's tensors as the servers' format (:func:`tensors_to_send`, on the policy's device). In a
  synchronous run they are read as the broadcast reaches each one, with no copy of the model: from the model
  (:class:`LiveWeights`), or under FSDP gathered then, every process taking part (:class:`StreamedWeights`; a
  push that loses a server mid-way is made again by every process). Sampling ahead, where the trainer may
  update while the push runs, and for FSDP with LoRA, whose merge reads each base weight with its adapters,
  they are staged as a copy when the weights are written (:class:`StagedWeights`). Then vLLM's engine sends
  them: ``/grouprl/transfer/start`` (each server pauses once its requests in flight finish),
  ``/grouprl/transfer/update`` alongside the broadcast, ``/grouprl/transfer/finish`` (prefix cache emptied, the
  version set, generation resumed), the last two with the token each server's start answered.
- The lease: each start asks for ``rollout_server_timeout`` as its lease (a server abandons a transfer whose
  trainer sent no call for that long: :mod:`grouprl.serve.lease`; every call of a live trainer to any server
  ends within it, so the next one comes in time) and waits as long for a lease another trainer holds: a
  trainer restarted after a crash, with the same timeout, outwaits its dead predecessor's lease.
- Names: the plain model's state dict, a tied output head under its own name too (as the files transport;
  the servers' vLLM loads whichever its model keeps). LoRA: the adapters merged into the base weights
  (W + scale * B A, :func:`merged_lora_tensors`), every push the whole model, sampled as the base model:
  vLLM's weight transfer loads base weights only (its LoRA requests load adapters from files).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from grouprl.rollout.vllm_weights import base_weight_name
from grouprl.serve.roster import RolloutServerError, Server, ServerFailure

JOIN_POLL_S = 0.2


def lora_delta(module: Any, adapter: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A peft LoRA linear layer's ``adapter`` as a change of its base weight, from the adapter's matrices ``a``
    (rank x in) and ``b`` (out x rank): ``scale * B A`` (transposed for a ``fan_in_fan_out`` layer), peft's
    ``get_delta_weight`` on the given matrices (half formats multiplied in fp32 on the CPU, as peft does)."""
    from peft.utils.other import transpose

    half = a.device.type == "cpu" and a.dtype in (torch.float16, torch.bfloat16)
    product = b.float() @ a.float() if half else b @ a
    return (transpose(product, module.fan_in_fan_out) * module.scaling[adapter]).to(a.dtype)


def merged_lora_tensors(model: nn.Module, state: dict[str, torch.Tensor] | None = None
                        ) -> Iterator[tuple[str, torch.Tensor]]:
    """A peft LoRA model's weights with each active adapter merged in (``W + scale * B A``, as peft's
    ``merge_and_unload`` computes it), under the plain model's names; ``state``: the model's whole state dict
    (gathered, where the model is sharded; None: read from it). Each base weight's change is made as it is
    reached, so one merged weight at a time takes memory. The model is left as it is."""
    from peft.tuners.lora import LoraLayer

    state = model.state_dict() if state is None else state
    adapters: dict[str, list[tuple[str, Any, str]]] = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    adapters.setdefault(f"{name}.base_layer.weight", []).append((name, module, adapter))
    for key, t in state.items():
        plain = base_weight_name(key)
        if plain is None:
            continue
        delta = None
        for name, module, adapter in adapters.get(key, ()):
            d = lora_delta(module, adapter, state[f"{name}.lora_A.{adapter}.weight"],
                           state[f"{name}.lora_B.{adapter}.weight"]).detach()
            delta = d if delta is None else delta + d
        yield plain, (t + delta.to(t.dtype) if delta is not None else t)


def tensors_to_send(model: nn.Module, dtype: torch.dtype,
                    state: dict[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]] | None = None
                    ) -> Iterator[tuple[str, torch.Tensor]]:
    """``model``'s weights as the servers load them (``state``: its whole state dict, gathered where the model
    is sharded, or for a model without LoRA its (name, tensor) pairs as they are read; None: read from it), one
    at a time: plain names (LoRA merged in), floating tensors in ``dtype``, contiguous, on the model's device (a
    tied head included twice, under each of its names). A tensor that needs no change is the model's own, not a
    copy."""
    state = model.state_dict() if state is None else state
    if hasattr(model, "peft_config"):
        named = merged_lora_tensors(model, dict(state))  # each base weight merged with its adapters
    else:
        named = state.items() if isinstance(state, dict) else state
    for name, t in named:
        t = t.detach()
        t = t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t
        yield name, t.contiguous()


def staged_copy(model: nn.Module, dtype: torch.dtype,
                state: dict[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]] | None = None
                ) -> list[tuple[str, torch.Tensor]]:
    """:func:`tensors_to_send`, each its own copy (the model may change before they are sent): the model's own
    tensors copied; the cast, merged or gathered ones (FSDP) already are, and are kept as they are."""
    held = set()
    for t in itertools.chain(model.parameters(), model.buffers()):
        local = t.to_local() if hasattr(t, "to_local") else t  # an FSDP shard: its process's part
        held.add(local.untyped_storage().data_ptr())
    return [(n, t.clone() if t.untyped_storage().data_ptr() in held else t)
            for n, t in tensors_to_send(model, dtype, state)]


def reachable_address(address: str) -> str:
    """This machine's address on the route to ``address`` (host:port): where a server can reach the trainer.
    (A UDP socket's connect sends nothing; it only picks the interface.)"""
    host, _, port = address.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, int(port)))
        return str(s.getsockname()[0])


def rank_offsets(workers: list[int]) -> list[int]:
    """Each server's first rank in the group: rank 0 is the trainer, then each server's workers in turn.

    >>> rank_offsets([1, 2, 1])
    [1, 2, 4]
    """
    offsets, next_rank = [], 1
    for n in workers:
        if n < 1:
            raise ValueError(f"a rollout server reported {n} workers")
        offsets.append(next_rank)
        next_rank += n
    return offsets


class ServersClient:
    """vLLM's ``VLLMWeightSyncClient`` (the four calls its trainer engine makes) over grouprl's routes of
    several servers at once, each told its rank offset at the handshake; ``version`` labels the next
    update. A failing server is named (host:port) in a :class:`RolloutServerError`."""

    def __init__(self, pool: Any, servers: list[Server]):
        self.pool, self.servers = pool, servers
        self.tokens: dict[str, str] = {}
        """Each server's token for the transfer under way (host:port -> what its start answered)."""
        self.offsets = rank_offsets([int(s.info.get("workers") or 1) for s in servers])
        self.world_size = 1 + sum(int(s.info.get("workers") or 1) for s in servers)
        self.version = 0
        self.joined: set[str] = set()
        self.failed: dict[str, str] = {}

    def _all(self, path: str, body: Callable[[Server], dict[str, Any]], timeout: float | None = None) -> None:
        """POST ``body(server)`` to every server at once; a start's answer gives the server's token."""
        async def one(server: Server) -> None:
            try:
                answer = await self.pool.request(server, "POST", path, body(server), timeout=timeout)
            except ServerFailure as e:
                raise RolloutServerError(f"rollout server {server.address}: {e.what}") from e
            if "token" in answer:
                self.tokens[server.address] = str(answer["token"])

        async def every() -> None:
            outcomes = await asyncio.gather(*(one(s) for s in self.servers), return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome

        self.pool.run(every())

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        def joined(server: Server, i: int) -> dict[str, Any]:
            return {"init_info": {**init_info, "rank_offset": self.offsets[i]}}

        async def one(server: Server, i: int) -> None:
            await self.pool.request(server, "POST", "/grouprl/transfer/init", joined(server, i))
            self.joined.add(server.address)

        async def every() -> None:
            outcomes = await asyncio.gather(*(one(s, i) for i, s in enumerate(self.servers)), return_exceptions=True)
            for server, outcome in zip(self.servers, outcomes):
                if isinstance(outcome, ServerFailure):
                    self.failed[server.address] = outcome.what
                elif isinstance(outcome, BaseException):
                    self.failed[server.address] = str(outcome)

        self.pool.run(every())

    def start_weight_update(self) -> None:
        lease = self.pool.timeout  # the wait for another lease, then the pause, each bounded by the timeout
        self.tokens.clear()
        self._all("/grouprl/transfer/start", lambda s: {"version": self.version, "lease_s": lease, "wait_s": lease},
                  timeout=2 * lease)

    def update_weights(self, update_info: Any) -> None:
        self._all("/grouprl/transfer/update", lambda s: {"token": self.tokens[s.address], "update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all("/grouprl/transfer/finish", lambda s: {"token": self.tokens[s.address]})
        for server in self.servers:
            server.version, server.adapter = self.version, None

    def abort(self, why: str) -> None:
        """Give up the transfer under way on every server that started it (failures ignored: a dead server holds
        nothing, and a server whose update runs abandons it once the group is torn down)."""
        async def every() -> None:
            await asyncio.gather(*(self.pool.request(s, "POST", "/grouprl/transfer/abort",
                                                     {"token": self.tokens[s.address], "why": why})
                                   for s in self.servers if s.alive and s.address in self.tokens),
                                 return_exceptions=True)

        self.pool.run(every())
        self.tokens.clear()

    def silent(self) -> list[tuple[Server, str]]:
        """The members that do not answer ``/grouprl/info`` (each with what failed)."""
        async def one(server: Server) -> str | None:
            try:
                await self.pool.request(server, "GET", "/grouprl/info", timeout=min(self.pool.timeout, 10.0))
            except ServerFailure as failure:
                return failure.what
            return None

        async def every() -> list[str | None]:
            return await asyncio.gather(*(one(s) for s in self.servers))

        return [(s, what) for s, what in zip(self.servers, self.pool.run(every())) if what is not None]

    def shutdown(self) -> None:
        """Ask every server to leave the group (failures ignored: the group is gone either way)."""
        async def every() -> None:
            await asyncio.gather(*(self.pool.request(s, "POST", "/grouprl/transfer/shutdown", {})
                                   for s in self.servers if s.alive), return_exceptions=True)

        self.pool.run(every())


class CollectiveWeights:
    """The trainer's sender for a collective transport; see the module docstring.

    Args:
        pool: the servers (:class:`~grouprl.serve.pool.ServerPool`).
        backend: vLLM's weight-transfer backend the servers must have enabled (nccl, gloo).
        init_info: (rendezvous host, port, group size, timeout) -> vLLM's trainer init info for ``backend``
            (its class selects vLLM's trainer engine).
        timeout: seconds the servers may take to join; ``setting``: the config field that sets it.
        stages: whether a push must send a copy made when the weights were written (the trainer updates while
            pushes run, or the weights are FSDP shards gathered by every process at the write), asked at each
            write; otherwise a push reads the model as it sends (:class:`LiveWeights`).
    """

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
        self.version = 0
        self._join()

    def _join(self) -> None:
        """Form the group with the living servers (vLLM's trainer engine; the servers join through their
        routes), or a RolloutServerError naming each server that did not join in time."""
        from vllm.distributed.weight_transfer import WeightTransferTrainerFactory

        from grouprl.serve.local import free_port

        servers = self.pool.living()
        client = ServersClient(self.pool, servers)
        host = reachable_address(servers[0].address)
        info = self.init_info(host, free_port(host), client.world_size, self.timeout)
        source = StagedSource(self)
        done: concurrent.futures.Future = concurrent.futures.Future()

        def join() -> None:
            try:
                done.set_result(WeightTransferTrainerFactory.trainer_init(info, client=client, source=source))
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                done.set_exception(e)

        threading.Thread(target=join, name="grouprl-weights-join", daemon=True).start()
        deadline = time.monotonic() + self.timeout
        while not done.done() and not client.failed and time.monotonic() < deadline:
            time.sleep(JOIN_POLL_S)
        if client.failed or not done.done():
            self.pool.cancel()  # the join requests still waiting end, and with them vLLM's thread that made them
            said = "; ".join(f"{a}: {why}" for a, why in client.failed.items())
            late = [s.address for s in servers if s.address not in client.joined and s.address not in client.failed]
            late_said = (f"{', '.join(late)} did not join within {self.timeout:g} s ({self.setting})") if late else ""
            raise RolloutServerError(f"the {self.backend} weight-transfer group (trainer at {host}:{info.master_port}) "
                                     f"did not form: {'; '.join(x for x in (said, late_said) if x)}")
        self.engine, self.client, self.members = done.result(), client, list(servers)
        self.roster = self.pool.roster_changes
        self.readmits = {s.address: s.readmits for s in servers}

    def write(self, model: nn.Module, read: Any, version: int, dtype: torch.dtype) -> None:
        """What the next push sends as ``version``: a copy of ``read`` (:class:`~grouprl.serve.transport.Reading`,
        whole on the policy's device) as the servers load it, where :attr:`stages` says so; else the model
        itself, read as the broadcast reaches each tensor (``read`` left to its reader: without shards it costs
        nothing). Either can be sent again if a push fails."""
        if self.stages():  # each tensor cast (and copied, if the model's own) as it is read
            self.sending = StagedWeights(staged_copy(model, dtype, read.tensors))
        else:
            self.sending = LiveWeights(model, dtype)
        self.version = version

    def push(self) -> None:
        """Send what :meth:`write` made ready to every server; a member that stopped answering mid-way is dropped
        and the push made again without it."""
        while not self._push_once():
            pass

    def stream(self, read: Any, version: int, dtype: torch.dtype) -> bool:
        """Push ``version`` read from ``read`` (:class:`~grouprl.serve.transport.Reading`, in ``dtype``) as the
        broadcast reaches each tensor: FSDP shards gathered then, every process taking part, so no copy of the
        model is staged. Once: False when a member stopped answering mid-way (it is dropped; the push is to be
        made again with a new reading, by every process)."""
        self.sending, self.version = StreamedWeights(read, dtype), version
        return self._push_once()

    def _push_once(self) -> bool:
        """One attempt at a push: True once sent; False when a member that stopped answering was dropped."""
        # a server was dropped (its workers would never receive) or is back (its new process is in no group), or a
        # failed push tore the group down
        if self.roster != self.pool.roster_changes or self.engine is None:
            self.close()
            returned = [s for s in self.pool.living() if self.readmits.get(s.address) != s.readmits]
            try:
                self._join()
            except RolloutServerError as e:
                if not returned:
                    raise
                self.pool.watch_returning()  # the failed join cancelled the watchers of the servers still away
                for server in returned:  # one that came back and cannot join stays out; the others go on
                    self.pool.drop(ServerFailure(server, f"it came back, then {e}"))
                self._join()
        self.client.version = self.version
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
            self.sending = StagedWeights([])  # a staged copy's memory back
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


class StagedWeights:
    """A push's tensors copied when the weights were written (:func:`staged_copy`)."""

    def __init__(self, tensors: list[tuple[str, torch.Tensor]]):
        self.tensors = tensors

    def metadata(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        return [(n, t.dtype, tuple(t.shape)) for n, t in self.tensors]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(list(self.tensors))


class LiveWeights:
    """A push's tensors read from the model as they are sent (:func:`tensors_to_send`), again at each push: one
    cast or merged tensor at a time takes memory, not a copy of the model. For a model that does not change
    between the write and the push (a synchronous run: the trainer waits for the rollout that the push
    starts)."""

    def __init__(self, model: nn.Module, dtype: torch.dtype):
        self.model, self.dtype = model, dtype

    def metadata(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        lora = hasattr(self.model, "peft_config")
        out = []
        for name, t in self.model.state_dict().items():
            plain = base_weight_name(name) if lora else name
            if plain is not None:
                out.append((plain, self.dtype if t.is_floating_point() else t.dtype, tuple(t.shape)))
        return out

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return tensors_to_send(self.model, self.dtype)


class StreamedWeights:
    """A push's tensors read from a :class:`~grouprl.serve.transport.Reading` as they are sent, once: each FSDP
    shard gathered (every process takes part) and cast to the servers' format as the broadcast reaches it."""

    def __init__(self, read: Any, dtype: torch.dtype):
        self.read, self.dtype = read, dtype

    def metadata(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        return [(e.name, e.dtype, e.shape) for e in self.read.entries]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, t in self.read.tensors:
            yield name, (t.to(self.dtype) if t.is_floating_point() and t.dtype != self.dtype else t).contiguous()
            del t  # not held while the next one is gathered


class StagedSource:
    """vLLM's ``WeightSource`` over what :meth:`CollectiveWeights.write` made ready last."""

    def __init__(self, weights: CollectiveWeights):
        self.weights = weights

    def metadata(self) -> list[Any]:
        from vllm.distributed.weight_transfer.base import ParamMeta

        return [ParamMeta(n, dtype, shape) for n, dtype, shape in self.weights.sending.metadata()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.weights.sending)

    def held_names(self) -> None:
        return None
