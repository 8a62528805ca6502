"""Process 0's rollout thread pushes while its trainer thread writes the next version (sampling ahead)."""

import threading
import types

import torch

from grouprl.serve.client.handover import WeightHandover
from grouprl.serve.weights.transport import WeightFolders


class FolderSender:
    """The files transport without servers: each version a folder, the older ones removed at a push."""

    def __init__(self, root):
        self.folders, self.writes, self.version = WeightFolders(root), [], 0

    def write(self, model, read, version, dtype):
        self.folders.write_full(model, read, version)
        self.writes.append(version)
        self.version = version

    def push(self):
        self.folders.keep_only(self.folders.path(self.version))


class MainRanks:
    """Process 0 of two whose broadcast takes long enough for its trainer thread to finish an update."""

    is_main, rank = True, 0

    def __init__(self, during):
        self.during = during

    def after_push(self, pool, version, error, again=False):
        if error is not None:
            raise error
        self.during()
        return version, again


def handover_of(model, sender, ranks=None, transport="files", sharded=False, dtype=None):
    """A :class:`WeightHandover` with ``sender`` and no servers; ``sharded``: as FSDP."""
    handover = WeightHandover(model, types.SimpleNamespace(), transport, ranks=ranks, dtype=dtype, lora=False,
                              timeout=1.0, weights_dir=None, sender=sender)
    handover.sharded = sharded  # the test's Linear stands for FSDP shards
    return handover


def test_a_version_written_during_process_0s_broadcast_is_written_once(tmp_path):
    model = torch.nn.Linear(2, 2)
    handover = handover_of(model, FolderSender(tmp_path))
    handover.follow(model)

    def trainer_updates():  # the trainer thread: the next version, written between updates
        handover.follow(model)
        handover.write_weights()

    handover.ahead = (threading.get_ident(), MainRanks(trainer_updates))
    handover.sync_weights()  # pushes version 1; version 2 is written while process 0 broadcasts
    assert (handover.pushed, handover.written) == (1, 2)
    handover.ahead = (threading.get_ident(), MainRanks(lambda: None))
    handover.sync_weights()  # the rollout thread's next batch: version 2 pushed, not written again
    assert handover.sender.writes == [1, 2] and (handover.pushed, handover.written) == (2, 2)
    assert [p.name for p in handover.sender.folders.root.iterdir()] == ["v2"]


class StreamingSender:
    """A collective sender whose first streamed push loses a server mid-way (after two tensors), as a server
    that dies during a broadcast: each push's tensors read, counted."""

    def __init__(self):
        self.pushes: list[int] = []

    def stream(self, read, version, dtype):
        sent = 0
        for _ in read.tensors:
            sent += 1
            if not self.pushes and sent == 2:
                self.pushes.append(sent)
                return False  # dropped; the reading's rest is read by sync_weights
        self.pushes.append(sent)
        return True


class Readings:
    """``reading`` counted: how many each process made and how many tensors it read of each."""

    def __init__(self, monkeypatch):
        from grouprl.serve.client import handover

        self.made, real = [], handover.reading

        def counted(model, keep=lambda name: True, dtype=None):
            read = real(model, keep, dtype)
            box = [0]
            self.made.append(box)

            def tensors(inner):
                for item in inner:
                    box[0] += 1
                    yield item

            read.tensors = tensors(read.tensors)
            return read

        monkeypatch.setattr(handover, "reading", counted)


def streaming_handover(model, ranks, sender):
    """FSDP, synchronous, over a collective transport: a streamed push."""
    handover = handover_of(model, sender, ranks, transport="gloo", sharded=True, dtype=torch.float32)
    handover.follow(model)
    handover.pushed = 0
    return handover


class Outcomes:
    """Process 0's push broadcast as another process receives it: one outcome per round."""

    is_main, rank = False, 1

    def __init__(self, rounds):
        self.rounds = list(rounds)

    def after_push(self, pool, version, error, again=False):
        return self.rounds.pop(0)


def test_a_streamed_push_that_lost_a_server_is_made_again_by_every_process_each_reading_to_its_end(monkeypatch):
    """Under FSDP a streamed push gathers each tensor as it is sent, every process taking part: when process 0
    drops a server mid-way it reads the rest, says so, and every process reads the weights again for the push
    made without it (a gather left unread, or one process alone reading again, would pair the gathers wrong)."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))  # 4 tensors
    readings = Readings(monkeypatch)
    sender = StreamingSender()
    handover = streaming_handover(model, None, sender)
    assert handover.streams_pushes
    handover.sync_weights()  # one process (FSDP on one GPU): the same loop without a broadcast
    assert sender.pushes == [2, 4] and [box[0] for box in readings.made] == [4, 4]
    assert (handover.written, handover.pushed) == (1, 1)
    handover.sync_weights()  # nothing new: no reading, no push
    assert len(readings.made) == 2
    # another process: it reads the weights once per round process 0 says, each to its end
    other = streaming_handover(model, Outcomes([(0, True), (1, False)]), None)
    readings.made.clear()
    other.sync_weights()
    assert [box[0] for box in readings.made] == [4, 4] and other.pushed == 1
    # not streamed (sampling ahead: a copy is staged at the write): nothing read in the sync
    ahead = streaming_handover(model, None, sender)
    assert ahead.sample_ahead() is ahead and not ahead.streams_pushes
