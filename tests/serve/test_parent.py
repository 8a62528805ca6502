"""A server started by a run stops when the run's process goes, however it goes (grouprl.serve.server.parent): on
stand-in processes, a "run" that starts a "server" (its own process group, with an "engine" child) and is then
SIGKILLed. Linux's /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grouprl.serve.server.parent import PARENT_ENV, group_members, parent_gone, watch_parent
from tests.helpers.servers import running

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Linux's /proc")
GONE_WITHIN_S = 30.0
"""A deadline for the stand-in server to notice and exit, not a speed claim (it polls every 0.1 s)."""

# The server: watches its parent, starts an "engine" in its group, says both pids, then waits, deaf to SIGTERM as a
# server whose orderly shutdown waits on a dead engine is.
SERVER = """
import os, signal, subprocess, sys, time
from grouprl.serve.server.parent import watch_parent
signal.signal(signal.SIGTERM, signal.SIG_IGN)
engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
watch_parent(poll_s=0.1)
print(os.getpid(), engine.pid, flush=True)
time.sleep(600)
"""
# The run: starts the server in a session of its own with its pid in GROUPRL_PARENT_PID, passes on the pids.
RUN = f"""
import os, subprocess, sys, time
server = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE,
                          env={{**os.environ, "{PARENT_ENV}": str(os.getpid())}}, start_new_session=True)
print(server.stdout.readline().decode().strip(), flush=True)
time.sleep(600)
"""


def wait_gone(pids: list[int]) -> list[int]:
    deadline = time.monotonic() + GONE_WITHIN_S
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if running(p)]


def test_a_server_whose_run_is_sigkilled_stops_with_its_engine():
    src = str(Path(__file__).resolve().parents[2] / "src")
    run = subprocess.Popen([sys.executable, "-c", RUN, SERVER], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env={**os.environ, "PYTHONPATH": src})
    server, engine = map(int, run.stdout.readline().split())
    try:
        assert running(server) and running(engine) and os.getpgid(engine) == server
        time.sleep(0.3)  # still there while the run lives
        assert running(server) and running(engine)
        run.send_signal(signal.SIGKILL)
        run.wait()
        assert wait_gone([server, engine]) == []
    finally:
        for pid in (server, engine):
            if running(pid):
                os.kill(pid, signal.SIGKILL)
    said = run.stderr.read()  # the server's stderr is the run's
    assert f"the run that started this server (process {run.pid}) is gone; stopping it and its engine" in said


def test_nothing_is_watched_without_a_parent_named_and_a_living_parent_is_not_gone(monkeypatch):
    monkeypatch.delenv(PARENT_ENV, raising=False)
    assert watch_parent() is None
    monkeypatch.setenv(PARENT_ENV, "not a pid")
    assert watch_parent() is None
    assert not parent_gone(os.getppid()) and parent_gone(os.getppid() + 1)
    assert group_members(os.getpgid(0))  # this process's group, as the server's kill reads it
