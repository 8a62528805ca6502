"""A rollout server started by a run ends with that run: ``PR_SET_PDEATHSIG`` alone is not enough (vLLM's shutdown
can hang), so it watches the run's pid (``GROUPRL_PARENT_PID``) and, once it is gone, kills its group and exits 1.
The group's kill spares Python's resource trackers, which free vLLM's shared memory."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

PARENT_ENV = "GROUPRL_PARENT_PID"
POLL_S = 0.5
KILL_ROUNDS = 5


def group_members(pgid: int) -> list[tuple[int, str]]:
    """The processes of group ``pgid`` not yet reaped, as ``(pid, state)`` (``Z``: a zombie)."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(entry.path, "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ", whose comm may hold anything
            if int(fields[2]) == pgid:
                out.append((int(entry.name), fields[0]))
    return out


def is_resource_tracker(pid: int) -> bool:
    try:
        return b"multiprocessing.resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def kill_group(pgid: int, spare: int | None = None) -> None:
    """SIGKILL every process of group ``pgid`` but the resource trackers and ``spare`` (without /proc, all of it)."""
    if not Path("/proc/self/stat").exists():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        return
    for _ in range(KILL_ROUNDS):  # again while the group forked something between the listing and the kill
        targets = [pid for pid, state in group_members(pgid)
                   if state != "Z" and pid != spare and not is_resource_tracker(pid)]
        if not targets:
            return
        for pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def parent_gone(expected: int) -> bool:
    return os.getppid() != expected


def _end(expected: int) -> None:
    print(f"grouprl serve: the run that started this server (process {expected}) is gone; stopping it and its "
          "engine processes", file=sys.stderr, flush=True)
    if os.getpgid(0) == os.getpid():  # a group of its own (a run starts it so): only its own processes are in it
        kill_group(os.getpid(), spare=os.getpid())
    os._exit(1)


def watch_parent(expected: int | None = None, poll_s: float = POLL_S) -> threading.Thread | None:
    """Watch for the end of process ``expected`` (None: ``GROUPRL_PARENT_PID``, if set) from a daemon thread."""
    if expected is None:
        text = os.environ.get(PARENT_ENV, "")
        if not text.isdigit():
            return None
        expected = int(text)

    def watch() -> None:
        while not parent_gone(expected):
            time.sleep(poll_s)
        _end(expected)

    thread = threading.Thread(target=watch, name="grouprl-parent-watch", daemon=True)
    thread.start()
    return thread
