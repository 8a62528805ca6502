"""Process 0's rollout thread pushes while its trainer thread writes the next version (sampling ahead)."""

import threading
import types

import torch

from grouprl.serve.client import ServerSampler
from grouprl.serve.transport import TRANSPORTS, WeightFolders


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

    def after_push(self, pool, version, error):
        if error is not None:
            raise error
        self.during()
        return version


def test_a_version_written_during_process_0s_broadcast_is_written_once(tmp_path):
    model = torch.nn.Linear(2, 2)
    sampler = ServerSampler.__new__(ServerSampler)
    sampler.model, sampler.sender = model, FolderSender(tmp_path)
    sampler.pool = types.SimpleNamespace(back_servers=lambda: [], rejoin=None)  # no server dropped, none back
    sampler.version, sampler.written, sampler.pushed, sampler.gathered, sampler.dtype = 1, None, None, None, None
    sampler.sharded, sampler.lora, sampler.transport = False, False, TRANSPORTS.get("files")
    sampler.weights_lock, sampler.sync_seconds, sampler.write_seconds = threading.Lock(), 0.0, 0.0

    def trainer_updates():  # the trainer thread: the next version, written between updates
        sampler.update_weights(model)
        sampler.write_weights()

    sampler.ahead = (threading.get_ident(), MainRanks(trainer_updates))
    sampler.sync_weights()  # pushes version 1; version 2 is written while process 0 broadcasts
    assert (sampler.pushed, sampler.written) == (1, 2)
    sampler.ahead = (threading.get_ident(), MainRanks(lambda: None))
    sampler.sync_weights()  # the rollout thread's next batch: version 2 pushed, not written again
    assert sampler.sender.writes == [1, 2] and (sampler.pushed, sampler.written) == (2, 2)
    assert [p.name for p in sampler.sender.folders.root.iterdir()] == ["v2"]
