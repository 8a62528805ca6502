"""The weights half of :class:`~grouprl.serve.client.server_sampler.ServerSampler`: the trainer's model handed over as
policy versions, written once each (:mod:`grouprl.serve.weights.transport`) and pushed to every server, by process 0
alone of several, the others waiting for its outcome (:mod:`grouprl.serve.client.ranks`).

A version is written from the thread that updates the weights, between updates; it is pushed at the start of the
next rollout (or, sampling ahead, of the next batch the rollout thread samples). Under FSDP every process takes
part in each gather: at the write, or during a streamed push (:attr:`Handover.streams_pushes`).
"""

from __future__ import annotations

import contextlib
import threading
import time

from torch import nn

from grouprl.serve.client.ranks import Ranks
from grouprl.serve.weights.transport import Reading, reading


class Handover:
    """Writes and pushes for a :class:`~.server_sampler.ServerSampler`, which sets what these read: ``model``,
    ``pool``, ``sender`` (None in a process other than 0), ``transport``, ``sharded``, ``lora``, ``dtype``,
    ``ranks``, ``ahead``, ``sampling_ahead``, the counts ``version``, ``written``, ``pushed``, ``gathered``, the
    ``weights_lock`` and the seconds ``sync_seconds``, ``write_seconds``; and ``_difference`` (why a server that is
    back cannot rejoin)."""

    def sample_ahead_in(self, ranks: Ranks) -> None:
        """From now on the calling thread samples ahead of the trainer (``max_staleness`` > 0) and pushes and
        receives weights on ``ranks``' own process group; the trainer's thread keeps the trainer's group."""
        self.ahead = (threading.get_ident(), ranks)

    def _ranks(self) -> Ranks | None:
        """The processes' Ranks for a collective made by the calling thread."""
        if self.ahead is not None and self.ahead[0] == threading.get_ident():
            return self.ahead[1]
        return self.ranks

    def update_weights(self, model: nn.Module) -> None:
        """Follow ``model`` from now on: it is the next policy version, sent before the next request."""
        self.model = model
        self.version += 1

    @property
    def stages_pushes(self) -> bool:
        """Whether a collective push sends a copy made at the write: the trainer may update before it is sent
        (sampling ahead), or the weights are FSDP shards, gathered by every process only at the write."""
        return self.sharded or self.sampling_ahead

    @property
    def pushable(self) -> int:
        """The newest version the next push can carry: the followed model's, which a push writes first, but under
        FSDP, sampling ahead, the trainer threads' last gather (the rollout thread writes nothing, and between an
        update and the next step's write the trainer is a version ahead of what it gathered)."""
        if self.sharded and self.ahead is not None and self.gathered is not None:
            return self.gathered
        return self.version

    def sync_weights(self) -> None:
        """Send the weights to every server if they changed since the last push. With several trainer
        processes a collective (every process calls it at the start of a rollout, or its rollout thread at the
        start of each batch it samples ahead): process 0 pushes, the others wait for its outcome
        (:meth:`.ranks.Ranks.after_push`). A streamed push (:attr:`streams_pushes`) that lost a server
        mid-way is made again by every process."""
        ranks = self._ranks()
        while True:
            streamed = self._streamed_reading()
            if ranks is None:
                with streamed.through() if streamed is not None else contextlib.nullcontext():
                    self.write_weights()
                    again = self.push_weights(streamed)
                if not again:
                    return
                continue
            error, again = None, False
            if ranks.is_main:
                try:
                    with streamed.through() if streamed is not None else contextlib.nullcontext():
                        self.write_weights()
                        again = self.push_weights(streamed)
                except Exception as e:  # noqa: BLE001 - raised by after_push, in every process
                    error = e
            else:
                self.write_weights()  # under FSDP, its part of process 0's gather
                if streamed is not None:
                    streamed.drain()  # its part of each gather of process 0's streamed push
            pushed, again = ranks.after_push(self.pool, self.pushed, error, again)
            # Sampling ahead, process 0's trainer may be a version ahead of this process's. Process 0 keeps its
            # own counts: its trainer thread may have written the next version during the broadcast, and setting
            # ``written`` back would write that version a second time.
            if not ranks.is_main:
                self.written = self.pushed = pushed
            if not again:
                break
        if self.ahead is None and pushed != self.version:
            raise RuntimeError(f"process {ranks.rank} is at policy version {self.version} but process 0 pushed "
                               f"{pushed}: the processes updated their weights a different number of times")

    @property
    def streams_pushes(self) -> bool:
        """Whether a push gathers each tensor as the broadcast reaches it, every process reading the weights
        during the push instead of process 0 staging a copy at the write: FSDP shards sent over a collective
        transport in a synchronous run, without LoRA (whose merge reads each base weight with its adapters)."""
        return self.sharded and not self.sampling_ahead and not self.lora and self.transport.backend is not None

    def _streamed_reading(self) -> Reading | None:
        """The weights a streamed push of a new version reads, made by every process alike (each takes part in
        every gather of it); None where no such push comes."""
        if self.streams_pushes and self.pushed != self.version:
            return reading(self.model, dtype=self.dtype)
        return None

    def write_weights(self) -> None:
        """Write the followed model's weights as its version, once (process 0 alone, of several). The write reads
        every parameter: call it from the thread that updates them, between updates (an asynchronous run does,
        at the start of each step). Under FSDP a collective of the trainer threads: every process gathers the
        shards one tensor at a time and process 0 writes each into the file as it comes (files) or stages it on
        its device (nccl, gloo); a rollout thread sampling ahead writes nothing then: the trainer threads have
        written what it pushes."""
        if self.sender is None and not self.sharded:
            return
        if self.sharded and self.ahead is not None and self.ahead[0] == threading.get_ident():
            return
        with self.weights_lock:
            if self.gathered == self.version:
                return
            if self.streams_pushes:  # the push gathers, every process taking part then (sync_weights)
                self.written = self.version if self.sender is not None else self.written
                self.gathered = self.version
                return
            start = time.perf_counter()
            keep = self.transport.keep(self.lora, first=self.gathered is None)
            read = reading(self.model, keep, self.dtype)
            with read.through():  # the other processes take part in each gather: read to the end, failing or not
                if self.sender is not None:
                    self.sender.write(self.model, read, self.version, self.dtype)
                    self.written = self.version
            self.gathered = self.version
            seconds = time.perf_counter() - start
            self.write_seconds += seconds
            self.sync_seconds += seconds

    def push_weights(self, streamed: Reading | None = None) -> bool:
        """Have every server load the newest written version (each waits for its requests in flight), and any
        server that is back load it too before it serves again; ``streamed``: the push reads the weights from it as
        it sends (:attr:`streams_pushes`). True when that push lost a server mid-way and must be made again with a
        new reading."""
        with self.weights_lock:
            start = time.perf_counter()
            if self.pushed != self.written:
                if self.pool.rejoin is None:  # a collective: a server that is back is in the group this push forms
                    for server in self.pool.back_servers():
                        difference = self._difference(server)
                        if difference:
                            self.pool.drop_again(server, difference)
                        else:
                            self.pool.readmit(server)
                if streamed is None:
                    self.sender.push()
                elif not self.sender.stream(streamed, self.written, self.dtype):
                    self.sync_seconds += time.perf_counter() - start
                    return True
                self.pushed = self.written
            if self.pool.rejoin is not None and self.pool.back_servers():
                self.pool.run(self.pool.rejoin_back())
            self.sync_seconds += time.perf_counter() - start
            return False
