"""The asynchronous collector's version and drop logic (:mod:`grouprl.trainer.ahead`) on a fake collector and a
fake sampler that answer at once: no server, no model. The real servers' side is tests/serve/test_async.py."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest
import torch

from grouprl.config import check
from grouprl.errors import ConfigError
from grouprl.run.logs import JsonlLog, PhaseTimer
from grouprl.run.seed_streams import PromptStream
from grouprl.trainer.ahead import AheadCollector, collect_ahead, row_versions
from grouprl.trainer.collect import Collected
from grouprl.trainer.config import TrainerConfig
from grouprl.types import RolloutBatch

P, G = 2, 2
SETTLE_S = 20.0


class FakeServers:
    """The sampler's side the collector uses: versions, writes (recorded with their thread), pushes, cancel."""

    uses_live_model = False

    def __init__(self) -> None:
        self.version, self.written, self.pushed = 0, None, None
        self.writers: list[str] = []
        self.cancelled = threading.Event()

    def update_weights(self, model) -> None:
        self.version += 1

    def write_weights(self) -> None:
        if self.written != self.version:
            self.written = self.version
            self.writers.append(threading.current_thread().name)

    def sync_weights(self) -> None:
        self.write_weights()
        self.pushed = self.written

    @property
    def pushable(self) -> int:
        return self.version  # the rollout thread's push writes the newest version first

    def enter_rollout_thread(self) -> None:
        self.rollout_thread = threading.current_thread().name

    def cancel(self) -> None:
        self.cancelled.set()


class ShardedServers(FakeServers):
    """As the sampler under FSDP: the rollout thread writes nothing (the write is a collective of the trainer
    threads, at the start of each step), so a push carries the version the trainer wrote last, which lags its
    version between an update and the next step's write."""

    @property
    def pushable(self) -> int:
        return self.version if self.written is None else self.written

    def sync_weights(self) -> None:
        self.pushed = self.written


def batch_of(versions: list[int | None]) -> RolloutBatch:
    b = len(versions)
    zeros = torch.zeros(b, 1)
    return RolloutBatch(prompt_ids=torch.zeros(b, 1, dtype=torch.long), prompt_mask=torch.ones(b, 1, dtype=torch.long),
                        completion_ids=torch.zeros(b, 1, dtype=torch.long), completion_mask=zeros + 1,
                        sampling_logprobs=zeros, truncated=torch.zeros(b, dtype=torch.bool), completions=[""] * b,
                        prompts=[""] * b, group_size=G, info={"policy_version": list(versions)})


class FakeCollector:
    """P prompts a batch from a seeded stream; each row reports the version the servers hold, or ``lag``
    versions less for the batches drawn with the seeds of ``stale_steps``; ``fail_at``: the seed step it raises at;
    ``block``: wait for the sampler's cancel, then raise as a cancelled request does."""

    def __init__(self, servers: FakeServers, stale_steps=(), lag=3, fail_at=None, block=False):
        self.servers, self.stale_steps, self.lag, self.fail_at, self.block = servers, stale_steps, lag, fail_at, block
        self.stream = PromptStream(100, 0)
        self.steps: list[int] = []

    def collect(self, step: int, timer: PhaseTimer) -> Collected:
        self.steps.append(step)
        with timer("rollout"):
            self.stream.take(P)
            if step == self.fail_at:
                raise ValueError(f"reward function broke at step {step}")
            if self.block:
                self.servers.cancelled.wait()
                raise concurrent.futures.CancelledError()
            v = self.servers.pushed - (self.lag if step in self.stale_steps else 0)
        return Collected(batch=batch_of([v] * (P * G)), rewards=torch.zeros(P * G), per_fn={}, rounds=1)


def settle(ahead: AheadCollector) -> None:
    deadline = time.monotonic() + SETTLE_S
    while not ahead.idle():
        assert time.monotonic() < deadline, f"the rollout thread is still busy after {SETTLE_S} s"
        time.sleep(0.005)


def train(ahead: AheadCollector, servers: FakeServers, steps: int) -> list[dict[str, float]]:
    """The trainer's loop as the collector sees it: take a batch, update (a new version), and let the rollout
    thread go as far as the bound allows before the next update and after it, so the versions do not depend on
    timing."""
    out = []
    for step in range(steps):
        got = ahead.collect(step, PhaseTimer())
        settle(ahead)
        servers.update_weights(None)
        settle(ahead)
        out.append(got.metrics)
    return out


def make(tmp_path, k, steps, **fake) -> tuple[AheadCollector, FakeServers, FakeCollector]:
    servers = FakeServers()
    inner = FakeCollector(servers, **fake)
    return AheadCollector(inner, servers, k, steps, tmp_path / "timeline.jsonl"), servers, inner


@pytest.mark.parametrize(("k", "want"), [(0, [0, 0, 0, 0, 0]), (1, [0, 1, 1, 1, 1]), (2, [0, 1, 2, 2, 2])])
def test_each_batch_is_as_stale_as_the_bound_allows_and_no_more(tmp_path, k, want):
    # k=2: batches 0, 1, 2 start on version 0 at once (0 + 0 + 2 queued - 0 = 2 <= 2) and are taken at versions
    # 0, 1, 2; batch 3 starts once batch 1 is taken (2 consumed + 1 queued - version 1 = 2) on version 1, taken
    # at version 3: 2 behind; and so on
    ahead, servers, inner = make(tmp_path, k, steps=5)
    try:
        metrics = train(ahead, servers, 5)
    finally:
        ahead.close()
    assert [m["async/staleness_max"] for m in metrics] == want
    assert [m["async/staleness"] for m in metrics] == want  # every row of a batch from one version
    assert inner.steps == [0, 1, 2, 3, 4]  # nothing sampled for a step beyond the run
    assert all(m["async/dropped"] == 0 for m in metrics)
    assert not ahead.thread.is_alive()  # it ended once the run's batches were all taken


@pytest.mark.parametrize("k", [1, 2])
def test_under_fsdp_a_batch_waits_for_the_version_the_trainer_writes_and_none_is_dropped(tmp_path, k):
    # after an update the trainer is at version v + 1 but has written only v until its next step: a batch started
    # then would be sampled by v and taken at v + 1 + queued, one version beyond the bound (so dropped)
    servers = ShardedServers()
    inner = FakeCollector(servers)
    ahead = AheadCollector(inner, servers, k, 6, tmp_path / "timeline.jsonl")
    try:
        metrics = train(ahead, servers, 6)
    finally:
        ahead.close()
    assert [m["async/dropped"] for m in metrics] == [0] * 6
    assert [m["async/staleness_max"] for m in metrics] == [min(step, k) for step in range(6)]
    assert inner.steps == list(range(6))


def test_a_batch_staler_than_the_bound_is_dropped_counted_and_replaced(tmp_path):
    ahead, servers, inner = make(tmp_path, 1, steps=4, stale_steps=(2,), lag=3)
    try:
        metrics = train(ahead, servers, 4)
    finally:
        ahead.close()
    # the batch of step 2's seeds is sampled on version 1 but reports 1 - 3 = -2: the trainer, at version 2, sees it
    # 2 - (-2) = 4 behind > 1, drops it and takes the next (step 3's seeds, sampled on version 2 once the trainer
    # took the dropped one's place: 0 behind)
    assert [m["async/dropped"] for m in metrics] == [0, 0, 1, 0]
    assert max(m["async/staleness_max"] for m in metrics) == 1
    assert inner.steps == [0, 1, 2, 3, 4]  # one more batch than steps: the dropped one's replacement
    lines = JsonlLog(tmp_path / "timeline.jsonl").records()
    dropped = [r for r in lines if r["event"] == "rollout" and r["dropped"]]
    assert [(r["step"], r["sampled_for"], r["staleness_max"]) for r in dropped] == [(3, 3, 4)]
    assert ahead.stream.position == 5 * P  # the dropped batch's prompts are behind the consumed position


def test_the_checkpointed_position_is_the_consumed_one_not_the_sampled_one(tmp_path):
    ahead, servers, inner = make(tmp_path, 1, steps=6)
    ahead.stream.position = 4  # a resume sets it before the first batch
    try:
        ahead.collect(0, PhaseTimer())
        settle(ahead)  # batch 1 is sampled ahead
        assert inner.stream.position == 4 + 2 * P and ahead.stream.position == 4 + P
        with pytest.raises(RuntimeError, match="on resume, before the first batch"):
            ahead.stream.position = 0
    finally:
        ahead.close()


def test_weights_are_written_by_the_trainers_thread_between_updates(tmp_path):
    servers = ShardedServers()  # whose rollout thread writes nothing, as under FSDP
    ahead = AheadCollector(FakeCollector(servers), servers, 1, 4, tmp_path / "timeline.jsonl")
    try:
        train(ahead, servers, 4)
    finally:
        ahead.close()
    # every version, 0 included (before the rollout thread starts), by the trainer's thread: under FSDP the write
    # is a collective of the trainer threads, and without it no batch would be sampled by a newer version
    assert len(servers.writers) == 4 and set(servers.writers) == {threading.current_thread().name}, servers.writers


def test_an_error_in_the_rollout_thread_is_raised_in_the_trainer(tmp_path):
    ahead, servers, inner = make(tmp_path, 1, steps=5, fail_at=2)
    try:
        with pytest.raises(ValueError, match="reward function broke at step 2"):
            train(ahead, servers, 5)
    finally:
        ahead.close()
    assert not ahead.thread.is_alive()


def test_close_cancels_the_batch_in_flight_and_stops_the_thread(tmp_path):
    ahead, servers, inner = make(tmp_path, 1, steps=5, block=True)
    ahead._start(0)  # what the first collect does, without waiting for a batch that never comes
    deadline = time.monotonic() + SETTLE_S
    while not ahead.sampling:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    ahead.close()
    assert servers.cancelled.is_set() and not ahead.thread.is_alive()
    assert ahead.error is None  # a cancel on the way out is no error


def test_versions_of_rows_and_the_fallback():
    assert row_versions([None, 2], 2, 7) == [0, 2]  # None: the weights a server started with
    assert row_versions(None, 3, 7) == [7, 7, 7]  # trajectories: the version pushed before the batch


def test_the_live_model_engine_cannot_sample_ahead(tmp_path):
    from grouprl.models import tiny_causal_lm
    from grouprl.rollout.sampler import Sampler

    model, tok = tiny_causal_lm()
    config = TrainerConfig(output_dir=str(tmp_path))
    config.max_staleness = 1  # past the config's own check, as a sampler passed in from Python would be
    with pytest.raises(ConfigError, match="max_staleness=1 needs rollout servers.*Sampler"):
        collect_ahead(object(), Sampler(model, tok), config)
    config.max_staleness = 0
    assert collect_ahead(object(), Sampler(model, tok), config) is None  # nothing sampled ahead


def test_the_config_refuses_sampling_ahead_without_servers_or_without_the_correction():
    with pytest.raises(ValueError, match="max_staleness=1 .* set rollout_servers"):
        check(TrainerConfig(max_staleness=1))
    with pytest.raises(ValueError, match="max_staleness=2 .* rollout_is must correct"):
        check(TrainerConfig(max_staleness=2, rollout_servers=("127.0.0.1:8000",), rollout_is="none"))
    with pytest.raises(ValueError, match="max_staleness=-1 must be a whole number >= 0"):
        check(TrainerConfig(max_staleness=-1))
    check(TrainerConfig(max_staleness=1, rollout_servers=("127.0.0.1:8000",), rollout_is="token"))  # accepted


def test_a_batch_beyond_total_steps_is_an_error_not_a_wait(tmp_path):
    ahead, servers, inner = make(tmp_path, 1, steps=2)
    try:
        train(ahead, servers, 2)
        with pytest.raises(RuntimeError, match="beyond the run's total_steps=2"):
            ahead.collect(2, PhaseTimer())
    finally:
        ahead.close()


def test_sampling_ahead_has_collective_pushes_send_a_copy_made_at_the_write(tmp_path):
    """The trainer updates while a push runs: the servers' hand-over is told, and stages what it sends (as it does
    for FSDP shards, which every process gathers only at the write); a synchronous run reads the model as it
    sends. The rollout thread the collector starts is the one the hand-over knows as such."""
    import types

    from grouprl.serve.client.handover import WeightHandover

    pool = types.SimpleNamespace(alive=[], setting="rollout_server_timeout")
    handover = WeightHandover(torch.nn.Linear(2, 2), pool, "files", ranks=None, dtype=torch.float32, lora=False,
                              timeout=1.0, weights_dir=str(tmp_path))
    engine = types.SimpleNamespace(sample_ahead=handover.sample_ahead)
    config = TrainerConfig(output_dir=str(tmp_path), rollout_servers=("127.0.0.1:8000",), rollout_is="token")
    assert collect_ahead("collector", engine, config) is None and not handover.stages_pushes
    config.max_staleness = 1
    ahead = collect_ahead("collector", engine, config)
    assert isinstance(ahead, AheadCollector) and ahead.handover is handover and handover.stages_pushes
    handover.close()
