"""One owner of the weight hand-over to rollout servers: the policy versions (made, written, pushed), the lock
between the thread that writes a version (between updates) and the one that pushes it (at the next rollout), and the
transport's sender."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import Any

import torch
from torch import nn

from grouprl.serve.client.ranks import Ranks
from grouprl.serve.weights.transport import TRANSPORTS, Reading, is_sharded, reading


class WeightHandover:
    """``model`` handed to the servers of ``pool`` as policy versions over ``transport``, in ``dtype``; a
    :class:`~grouprl.rollout.protocol.SamplesAhead`."""

    def __init__(self, model: nn.Module, pool: Any, transport: str, *, ranks: Ranks | None, dtype: torch.dtype,
                 lora: bool, timeout: float, weights_dir: str | None, sender: Any = None):
        self.model, self.pool, self.ranks, self.dtype, self.lora = model, pool, ranks, dtype, lora
        self.weights_dir = weights_dir
        self.transport = TRANSPORTS.get(transport)
        self.sharded = ranks is not None and is_sharded(model)  # every process takes part in each gather
        self.version, self.written, self.pushed, self.gathered = 0, None, None, None
        self.lock = threading.Lock()  # one writer or pusher at a time (an asynchronous run has two threads)
        self.sync_seconds = self.write_seconds = 0.0
        self.sampling_ahead = False  # the trainer updates while pushes run (sample_ahead)
        self.ahead_ranks: Ranks | None = None
        self.ahead: tuple[int, Ranks] | None = None  # (the rollout thread, its Ranks): :meth:`enter_rollout_thread`
        if sender is None and (ranks is None or ranks.is_main):
            sender = self.transport.sender(self, timeout)
        self.sender = sender

    def follow(self, model: nn.Module) -> None:
        self.model = model
        self.version += 1

    def sample_ahead(self) -> WeightHandover:
        """The trainer may update while a push runs; the rollout threads get a process group of their own."""
        self.sampling_ahead = True
        if self.ranks is not None:
            import torch.distributed as dist

            self.ahead_ranks = dataclasses.replace(self.ranks, group=dist.new_group(backend="gloo"))
        return self

    def enter_rollout_thread(self) -> None:
        if self.ahead_ranks is not None:
            self.ahead = (threading.get_ident(), self.ahead_ranks)

    def cancel(self) -> None:
        self.pool.cancel()

    def check_pushed(self) -> None:
        if self.ranks is not None and self.ahead is None and self.pushed != self.version:
            raise RuntimeError(f"process {self.ranks.rank} samples with policy version {self.version} not pushed "
                               "yet: with several trainer processes, sample inside phase()")

    def _in_rollout_thread(self) -> bool:
        return self.ahead is not None and self.ahead[0] == threading.get_ident()

    @property
    def stages_pushes(self) -> bool:
        """A collective push sends a copy made at the write (the model may change before, or is FSDP shards)."""
        return self.sharded or self.sampling_ahead

    @property
    def streams_pushes(self) -> bool:
        """A collective push gathers each FSDP tensor as it is sent (synchronous, without LoRA)."""
        return self.sharded and not self.sampling_ahead and not self.lora and self.transport.backend is not None

    @property
    def pushable(self) -> int:
        """Under FSDP sampling ahead, the trainer threads' last gather (the rollout thread writes nothing)."""
        if self.sharded and self.ahead is not None and self.gathered is not None:
            return self.gathered
        return self.version

    def take_seconds(self) -> tuple[float, float]:
        """(writing and loading, writing alone) seconds since the last call."""
        out = (self.sync_seconds, self.write_seconds)
        self.sync_seconds = self.write_seconds = 0.0
        return out

    def sync_weights(self) -> None:
        """Send the weights if they changed; of several processes a collective (process 0 pushes, all take its news)."""
        ranks, again = self.ahead[1] if self._in_rollout_thread() else self.ranks, True
        while again:
            new = self.streams_pushes and self.pushed != self.version  # a streamed push reads it, every process alike
            streamed, error, again = reading(self.model, dtype=self.dtype) if new else None, None, False
            if ranks is None or ranks.is_main:
                try:
                    with streamed.through() if streamed is not None else contextlib.nullcontext():
                        self.write_weights()
                        again = self.push_weights(streamed)
                except Exception as e:  # noqa: BLE001 - raised by after_push, in every process
                    if ranks is None:
                        raise
                    error = e
            else:
                self.write_weights()  # under FSDP, its part of process 0's gather
                if streamed is not None:
                    streamed.drain()  # its part of each gather of process 0's streamed push
            if ranks is None:
                continue
            pushed, again = ranks.after_push(self.pool, self.pushed, error, again)
            # process 0 keeps its own counts: sampling ahead, its trainer thread may have written the next version
            if not ranks.is_main:
                self.written = self.pushed = pushed
        if ranks is not None and self.ahead is None and pushed != self.version:
            raise RuntimeError(f"process {ranks.rank} is at policy version {self.version} but process 0 pushed "
                               f"{pushed}: the processes updated their weights a different number of times")

    def write_weights(self) -> None:
        """Write the followed model's weights as its version, once, between updates (under FSDP a collective)."""
        if self._in_rollout_thread() if self.sharded else self.sender is None:  # a rollout thread gathers nothing
            return
        with self.lock:
            if self.gathered == self.version:
                return
            if self.streams_pushes:  # the push gathers, every process taking part then (sync_weights)
                self.written = self.version if self.sender is not None else self.written
                self.gathered = self.version
                return
            start = time.perf_counter()
            read = reading(self.model, self.transport.keep(self.lora, first=self.gathered is None), self.dtype)
            with read.through():  # the other processes take part in each gather: read to the end, failing or not
                if self.sender is not None:
                    self.sender.write(self.model, read, self.version, self.dtype)
                    self.written = self.version
            self.gathered = self.version
            seconds = time.perf_counter() - start
            self.write_seconds += seconds
            self.sync_seconds += seconds

    def push_weights(self, streamed: Reading | None = None) -> bool:
        """Have every server load the newest written version; True when it is to be made again with a new reading."""
        with self.lock:
            start = time.perf_counter()
            if self.pushed != self.written:
                if streamed is None:
                    self.sender.push()
                elif not self.sender.stream(streamed, self.written, self.dtype):
                    self.sync_seconds += time.perf_counter() - start
                    return True
                self.pushed = self.written
            self.sync_seconds += time.perf_counter() - start
            return False

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
