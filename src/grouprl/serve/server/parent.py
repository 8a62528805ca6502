"""A rollout server started by a run ends with that run, however the run ends.

The run starts each server with ``PR_SET_PDEATHSIG`` (:mod:`grouprl.serve.client.local_servers`): the kernel sends it
SIGTERM when the run's process dies. That alone is not enough: a SIGTERM to a server whose engine is dead can leave
vLLM's shutdown waiting on it forever, and a run that dies between the fork and the ``prctl`` sends nothing.
So a server told its run's process id (``GROUPRL_PARENT_PID``) also watches it from a thread: once its parent is
no longer that process, it says so on stderr, kills the rest of its process group (vLLM's engine processes, but
not the resource tracker that frees their shared memory once they are gone: see
:mod:`grouprl.serve.client.local_servers`) and exits with status 1 at once. An orderly shutdown has nobody to serve:
the run that would use the server is gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

from grouprl.serve.client.local_servers import PARENT_ENV, group_members, is_resource_tracker

POLL_S = 0.5


def parent_gone(expected: int) -> bool:
    """Whether this process's parent is no longer process ``expected`` (it died: the process was re-parented)."""
    return os.getppid() != expected


def _end(expected: int) -> None:
    print(f"grouprl serve: the run that started this server (process {expected}) is gone; stopping it and its "
          "engine processes", file=sys.stderr, flush=True)
    me = os.getpid()
    if os.getpgid(0) == me:  # a group of its own (a run starts it so): only its own processes are in it
        for pid, state in group_members(me):
            if pid != me and state != "Z" and not is_resource_tracker(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
    os._exit(1)


def watch_parent(expected: int | None = None, poll_s: float = POLL_S) -> threading.Thread | None:
    """Watch for the end of process ``expected`` (None: ``GROUPRL_PARENT_PID``, and nothing is watched where it is
    not set) from a daemon thread; see the module docstring. An expected parent already gone ends the server
    at once."""
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
