"""Collecting ahead of the trainer (``max_staleness: k`` > 0, docs/async.md): a background thread samples the next
steps' batches on the servers while the trainer updates. A version is one weight hand-over; a batch starts only
when it will be consumed within k versions of the one sampling it, and one that arrives staler is dropped
(``async/dropped``) and sampled again. ``timeline.jsonl`` records when batches and trainer phases ran."""

from __future__ import annotations

import threading
import time
import warnings
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grouprl.errors import ConfigError
from grouprl.rollout.protocol import RolloutEngine, SamplesAhead
from grouprl.run.logs import JsonlLog, PhaseTimer
from grouprl.trainer.collect import Collected
from grouprl.trainer.config import TrainerConfig
from grouprl.trainer.one_process import OneProcess

POLL_S = 0.05
STOP_WITHIN_S = 30.0  # how long close() waits for the rollout thread


@dataclass
class Ahead:
    got: Collected
    step: int
    timer: PhaseTimer
    start: float
    end: float
    position: int
    """The prompt stream's position after it."""
    versions: list[int]
    """``[B]`` the policy version that sampled each row."""


def row_versions(reported: list[int | None] | None, rows: int, fallback: int) -> list[int]:
    """The policy version of each of ``rows`` rows as the engine ``reported`` them (None: a server's own
    weights, version 0), or ``fallback`` for all where it reported none (multi-turn trajectories).

    >>> row_versions([3, None, 4], 3, 9), row_versions(None, 2, 5)
    ([3, 0, 4], [5, 5])
    """
    if reported is None or len(reported) != rows:
        return [fallback] * rows
    return [0 if v is None else int(v) for v in reported]


def behind(trainer_version: int, versions: list[int]) -> tuple[float, int]:
    """(mean, max) versions the rows of a batch are behind ``trainer_version``; a row ahead is an error.

    >>> behind(5, [4, 4, 3, 5])
    (1.0, 2)
    """
    lags = [trainer_version - v for v in versions]
    if min(lags) < 0:
        raise RuntimeError(f"a rollout reports policy version {max(versions)} but the trainer has made only "
                           f"{trainer_version}: the rollout servers hold weights this run did not send (restart them)")
    return sum(lags) / len(lags), max(lags)


class ConsumedStream:
    """The prompt stream as the trainer consumed it (what a checkpoint records and a resume sets)."""

    def __init__(self, owner: AheadCollector):
        self.owner = owner

    @property
    def position(self) -> int:
        o = self.owner
        return o.inner.stream.position if o.thread is None else o.position

    @position.setter
    def position(self, value: int) -> None:
        if self.owner.thread is not None:
            raise RuntimeError("the prompt stream's position is set on resume, before the first batch is sampled")
        self.owner.inner.stream.position = value


class AheadCollector:
    """``inner``'s batches sampled up to ``max_staleness`` versions ahead through ``handover``."""

    def __init__(self, inner: Any, handover: SamplesAhead, max_staleness: int, total_steps: int,
                 timeline: Path | None, processes: Any = None):
        self.inner, self.handover, self.k, self.total_steps = inner, handover, max_staleness, total_steps
        self.processes = processes if processes is not None else OneProcess()
        self.stream = ConsumedStream(self)
        self.timeline = JsonlLog(timeline) if timeline is not None else None
        self.cond = threading.Condition()
        self.ready: deque[Ahead] = deque()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.stopping = self.sampling = False
        self.first_step = self.base_version = self.produced = self.consumed = 0
        self.position, self.t0 = 0, 0.0
        self.last_timer: tuple[int, PhaseTimer, set[str]] | None = None

    # -- the rollout thread -------------------------------------------------------------------------
    def _start(self, step: int) -> None:
        self.first_step, self.base_version = step, self.handover.version
        self.position, self.t0 = self.inner.stream.position, time.perf_counter()
        if self.timeline is not None:
            self.timeline.truncate_after(step)
        self.thread = threading.Thread(target=self._run, name="grouprl-rollout-ahead", daemon=True)
        self.thread.start()

    def _may_start(self) -> bool:
        """The run still needs a next batch and it would be consumed at most k versions behind."""
        queued = len(self.ready)
        if self.consumed + queued >= self.total_steps - self.first_step:
            return False
        return self.base_version + self.consumed + queued - self.handover.pushable <= self.k

    def _run(self) -> None:
        self.handover.enter_rollout_thread()
        while True:
            with self.cond:
                while not self.stopping and not self._may_start():
                    if self.consumed >= self.total_steps - self.first_step:
                        return  # every batch of the run is consumed
                    self.cond.wait(POLL_S)
                if self.stopping:
                    return
                step = self.first_step + self.produced
                self.produced, self.sampling = self.produced + 1, True
            try:
                self._sample(step)
            except BaseException as e:  # noqa: BLE001 - handed to the trainer's thread, raised there
                with self.cond:
                    if not self.stopping:
                        self.error = e
                    self.sampling = False
                    self.cond.notify_all()
                return

    def _sample(self, step: int) -> None:
        self.handover.sync_weights()
        version, timer, start = self.handover.pushed, PhaseTimer(), time.perf_counter()
        got = self.inner.collect(step, timer)
        rows = got.batch.batch_size
        batch = Ahead(got, step, timer, start, time.perf_counter(), self.inner.stream.position,
                      row_versions(got.batch.info.get("policy_version"), rows, version))
        with self.cond:
            self.ready.append(batch)
            self.sampling = False
            self.cond.notify_all()

    def idle(self) -> bool:
        """The rollout thread samples nothing and the bound lets it start nothing."""
        with self.cond:
            return not self.sampling and (self.error is not None or self.stopping or not self._may_start())

    # -- the trainer's side -------------------------------------------------------------------------
    def collect(self, step: int, timer: PhaseTimer) -> Collected:
        """The next batch at most k versions behind the trainer; the wait is timed as ``trainer_idle``."""
        self.handover.write_weights()  # between updates: the rollout thread may load them at once
        if self.thread is None:
            self._start(step)
        with self.cond:
            self.cond.notify_all()  # the trainer's version moved: the rollout thread may start a batch
        self._log_trainer()
        waited, depth, dropped = time.perf_counter(), None, 0
        while True:
            batch, ready, version, mean, most = self._take()
            depth = ready if depth is None else depth
            self._log_rollout(step, batch, version, most, dropped=most > self.k)
            if most <= self.k:
                break
            dropped += 1
        end = time.perf_counter()
        timer.seconds["trainer_idle"] = timer.seconds.get("trainer_idle", 0.0) + end - waited
        timer.spans["trainer_idle"] = (waited, end)
        for phase, seconds in batch.timer.seconds.items():  # the rollout that made the batch, off the trainer's path
            timer.seconds[phase] = timer.seconds.get(phase, 0.0) + seconds
            timer.spans[phase] = batch.timer.spans[phase]
        self.last_timer = (step, timer, {*batch.timer.seconds, "trainer_idle"})
        got = batch.got
        got.metrics = {**got.metrics, "async/staleness": mean, "async/staleness_max": float(most),
                       "async/queue_depth": float(depth), "async/dropped": float(dropped)}
        return got

    def _take(self) -> tuple[Ahead, int, int, float, int]:
        """(oldest batch, how many were ready, trainer's version, mean and most versions behind), or the error."""
        with self.cond:
            ready = len(self.ready)
            while not self.ready and self.error is None:
                if not self.thread.is_alive():
                    raise RuntimeError(f"a batch was asked for beyond the run's total_steps={self.total_steps}, "
                                       "past which the rollout thread samples none")
                self.cond.wait(POLL_S)
            if not self.ready:
                self._most_of_all(None)  # the other processes learn of it, and raise with this one
                raise self.error
            batch = self.ready.popleft()
            version = self.handover.version
        mean, most = behind(version, batch.versions)
        most = self._most_of_all(most)
        with self.cond:
            self.position = batch.position
            if most <= self.k:
                self.consumed += 1
            self.cond.notify_all()
            return batch, ready, version, mean, most

    def _most_of_all(self, most: int | None) -> int | None:
        """The most versions behind over every process (None: failed), so all drop a stale batch together."""
        every = self.processes.gather(most)
        failed = [r for r, m in enumerate(every) if m is None]
        if most is not None and failed:
            raise RuntimeError(f"the rollout thread of process {failed[0]} of {len(every)} failed (its own "
                               "error is raised there)")
        return None if most is None else max(every)

    # -- timeline -----------------------------------------------------------------------------------
    def _log_rollout(self, step: int, batch: Ahead, version: int, most: int, dropped: bool) -> None:
        if self.timeline is not None:
            self.timeline.append({"step": step + 1, "event": "rollout", "sampled_for": batch.step + 1,
                                  "start": batch.start - self.t0, "end": batch.end - self.t0,
                                  "versions": [min(batch.versions), max(batch.versions)], "trainer_version": version,
                                  "staleness_max": most, "dropped": dropped})

    def _log_trainer(self) -> None:
        """The previous step's phases in the trainer's thread."""
        if self.timeline is None or self.last_timer is None:
            return
        step, timer, borrowed = self.last_timer
        phases = {k: [s - self.t0, e - self.t0] for k, (s, e) in timer.spans.items() if k not in borrowed}
        if phases:
            self.timeline.append({"step": step + 1, "event": "trainer", "phases": phases})
        self.last_timer = None

    # -- stopping -----------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the rollout thread, cancelling requests in flight; wait at most :data:`STOP_WITHIN_S`."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self._log_trainer()
        if self.thread is None:
            return
        deadline = time.monotonic() + STOP_WITHIN_S
        while self.thread.is_alive() and time.monotonic() < deadline:
            self.handover.cancel()  # again each round: a batch may send requests after the last cancel
            self.thread.join(0.5)
        if self.thread.is_alive():
            warnings.warn(f"the rollout thread did not stop within {STOP_WITHIN_S:g} s of the run's end (a reward "
                          "function still running?); it is a daemon thread and ends with the process", stacklevel=2)


def collect_ahead(collector: Any, sampler: RolloutEngine, config: TrainerConfig, processes: Any = None
                  ) -> AheadCollector | None:
    """An :class:`AheadCollector` around ``collector``, or None with ``max_staleness`` 0. Every process calls it."""
    k = config.max_staleness
    if not k:
        return None
    ahead = sampler.sample_ahead()
    if ahead is None:
        raise ConfigError(f"max_staleness={k} needs rollout servers (rollout_servers), whose weights are copies the "
                          f"trainer pushes; this run's rollout engine, {type(sampler).__name__}, samples in this "
                          "process (set max_staleness 0)")
    processes = processes if processes is not None else OneProcess()
    timeline = Path(config.output_dir) / "timeline.jsonl" if processes.is_main else None
    return AheadCollector(collector, ahead, k, config.total_steps, timeline, processes)
