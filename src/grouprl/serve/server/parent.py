"""A rollout server started by a run ends with that run: ``PR_SET_PDEATHSIG`` alone is not enough (vLLM's shutdown
can hang), so it watches the run's pid (``GROUPRL_PARENT_PID``) and, once it is gone, kills its group and exits 1."""

from __future__ import annotations

import os
import sys
import threading
import time

from grouprl.serve.client.local_servers import PARENT_ENV, kill_group

POLL_S = 0.5


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
