"""Scratch folders go with their process: removed on request, at exit, and after a SIGKILL to the
owner's whole process group, but not while a fork of the owner may still read them."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from grouprl.rollout.scratch import ScratchFolder

GONE_WITHIN_S = 60.0
"""A deadline for the watcher to act, not a speed claim: a loaded machine may take seconds to schedule it."""


def _gone(path: Path) -> bool:
    deadline = time.monotonic() + GONE_WITHIN_S
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not path.exists()


def _owner(tmp_path: Path, body: str = "") -> tuple[subprocess.Popen, Path]:
    """A process of its own (its own process group) that makes a scratch folder under ``tmp_path``, writes a
    file in it, prints its path, runs ``body`` and then sleeps until killed."""
    code = ("import sys, time\n"
            "from grouprl.rollout.scratch import ScratchFolder\n"
            f"s = ScratchFolder('t-', {str(tmp_path)!r})\n"
            "(s.path / 'weights').write_bytes(b'x' * 4096)\n"
            f"{body}\n"
            "print(s.path, flush=True)\n"
            "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    return proc, Path(proc.stdout.readline().strip())


def test_remove_deletes_the_folder_and_ends_the_watcher(tmp_path):
    s = ScratchFolder("t-", tmp_path)
    (s.path / "a").write_text("x")
    assert s.path.parent == tmp_path and s.path.name.startswith("t-") and not s.removed
    watcher = s._watcher
    s.remove()
    assert not s.path.exists() and s.removed and watcher.returncode == 0
    s.remove()  # again: nothing to do
    assert list(tmp_path.iterdir()) == []


def test_a_process_that_ends_without_removing_leaves_nothing(tmp_path):
    code = ("from grouprl.rollout.scratch import ScratchFolder\n"
            f"s = ScratchFolder('t-', {str(tmp_path)!r}); (s.path / 'f').write_text('x'); print(s.path)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert _gone(Path(out.stdout.strip()))


def test_a_sigkill_to_the_owners_whole_group_still_removes_its_folder_and_nothing_else(tmp_path):
    beside = tmp_path / "not-ours"
    beside.mkdir()
    proc, path = _owner(tmp_path)
    assert (path / "weights").stat().st_size == 4096
    os.killpg(proc.pid, signal.SIGKILL)  # the watcher is in a session of its own: the group's signal misses it
    proc.wait()
    assert _gone(path)
    assert beside.is_dir() and list(tmp_path.iterdir()) == [beside]


def test_a_fork_of_the_owner_keeps_the_folder_until_it_exits_too(tmp_path):
    gate = tmp_path / "gate"
    body = ("import os\n"
            "if os.fork() == 0:\n"
            f"    while not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
            "    os._exit(0)\n")
    proc, path = _owner(tmp_path, body)
    proc.kill()
    proc.wait()
    time.sleep(1.0)  # time enough for a watcher that wrongly woke to have removed it
    assert (path / "weights").is_file()
    gate.touch()  # the fork exits: the last holder of the pipe is gone
    assert _gone(path)
