"""A full disk during a save: the error says so and how much was needed, the partial checkpoint is removed,
the previous one stays, and claiming the folder again leaves no empty lock behind."""

from __future__ import annotations

import errno
import os
import shutil
from collections import namedtuple

import pytest
import torch

from grouprl.errors import CheckpointError, ConfigError
from grouprl.run import checkpoint_files as ckpt
from grouprl.run.folder import LOCK, FolderLock

Usage = namedtuple("Usage", "total used free")


def parts():
    torch.manual_seed(0)
    policy = torch.nn.Linear(64, 64)  # 64 * 64 + 64 = 4160 floats: 16,640 bytes
    optimizer = torch.optim.Adam(policy.parameters())
    policy(torch.ones(1, 64)).sum().backward()
    optimizer.step()  # Adam's two moments: 2 * 16,640 bytes, and a step counter per parameter (2 floats)
    return policy, optimizer


def full_disk(monkeypatch, free: int = 1000) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - free, free))


@pytest.mark.parametrize("failure", ["enospc", "short_write"])
def test_a_full_disk_says_so_removes_the_partial_checkpoint_and_keeps_the_previous(tmp_path, monkeypatch, failure):
    root = tmp_path / "checkpoints"
    policy, optimizer = parts()
    first = ckpt.save_checkpoint(root, 1, policy=policy, state={}, stateful={"optimizer": optimizer}, keep=1)
    real_save = torch.save

    def save_then_fail(obj, path, *args, **kwargs):  # the optimizer file gets half written, then the disk is full
        if str(path).endswith("optimizer.pt"):
            with open(path, "wb") as f:
                f.write(b"\0" * 100)
            if failure == "enospc":
                raise OSError(errno.ENOSPC, "No space left on device")
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4288 vs 4204")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_then_fail)
    full_disk(monkeypatch)
    with pytest.raises(CheckpointError) as caught:
        ckpt.save_checkpoint(root, 2, policy=policy, state={}, stateful={"optimizer": optimizer}, keep=1)
    message = str(caught.value)
    # needed: weights 16,640 + Adam's moments 33,280 + its 2 step counters (8 bytes) = 49,928 bytes = 48.8 KiB
    assert "is full: checkpoint step 2 needs about 48.8 KiB and 1000 B is free" in message
    assert ckpt._state_bytes(policy, None, {"optimizer": optimizer}, None) == 16_640 + 33_280 + 8
    assert f"the previous one, {first}, is kept" in message
    assert sorted(p.name for p in root.iterdir()) == ["step-000001"], "the partial checkpoint was left"
    assert ckpt.latest_complete(root) == first
    ckpt.verify_checkpoint(first)  # every file still matches its manifest


def test_an_error_that_is_not_a_full_disk_goes_on_unchanged_and_leaves_nothing(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    policy, optimizer = parts()

    def broken(obj, path, *args, **kwargs):
        raise ValueError("not serialisable")

    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(ValueError, match="not serialisable"):
        ckpt.save_checkpoint(root, 1, policy=policy, state={}, stateful={"optimizer": optimizer})
    assert list(root.iterdir()) == []


def test_claiming_a_folder_on_a_full_disk_leaves_no_empty_lock(tmp_path, monkeypatch):
    real_fdopen = os.fdopen

    class FullFile:
        def __init__(self, fd, *args, **kwargs):
            self.f = real_fdopen(fd, *args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fdopen", FullFile)
    full_disk(monkeypatch, free=0)
    with pytest.raises(ConfigError, match=r"writing \.grouprl\.lock failed \(No space left on device; 0\.0 MiB free"):
        FolderLock(tmp_path).acquire(print)
    assert not (tmp_path / LOCK).exists()
