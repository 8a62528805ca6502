"""Rollout servers started for one run (``rollout_servers: N``), each pinned to its share of the cores. They never
outlive it: :meth:`LocalServers.stop` and ``atexit`` end each process group, ``PR_SET_PDEATHSIG`` and a watch of the
run cover its death; Python's resource tracker is spared, to free vLLM's shared memory."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from grouprl.serve.client.servers import free_port
from grouprl.serve.server.guard import TOKEN_ENV
from grouprl.serve.server.parent import PARENT_ENV, kill_group

PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 10.0
LOG_TAIL_CHARS = 600


def core_shares(cores: Sequence[int], count: int) -> list[list[int]]:
    """``cores`` cut into ``count`` contiguous shares as equal as can be (round-robin if fewer cores than servers).

    >>> core_shares([0, 1, 2, 3, 4], 2), core_shares([0, 1], 3)
    ([[0, 1, 2], [3, 4]], [[0], [1], [0]])
    """
    cores = list(cores)
    if count > len(cores):
        return [[cores[i % len(cores)]] for i in range(count)]
    size, extra = divmod(len(cores), count)
    bounds = [i * size + min(i, extra) for i in range(count + 1)]
    return [cores[bounds[i]:bounds[i + 1]] for i in range(count)]


def _child_setup(cores: list[int], parent: int) -> None:  # in the child, between fork and exec
    os.sched_setaffinity(0, cores)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the run died before the prctl: no signal will come
        os._exit(1)


class LocalServers:
    """``count`` ``grouprl serve`` processes on the model folder ``model`` with ``options``; ``token`` (None: a new one)
    goes in their environment, never their command line, which every user sees."""

    def __init__(self, count: int, model: str | Path, options: Sequence[str], log_dir: str | Path,
                 cores: Sequence[int] | None = None, host: str = "127.0.0.1", weights_root: str | Path | None = None,
                 token: str | None = None):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"rollout_servers: a number of local servers must be >= 1, got {count!r}")
        self.token = token or secrets.token_urlsafe(32)
        self.root_argv = ["--weights_root", str(weights_root)] if weights_root is not None else []
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        shares = core_shares(sorted(cores if cores is not None else os.sched_getaffinity(0)), count)
        self.cores, self.host, self.options = shares, host, list(options)
        self.processes: list[subprocess.Popen] = []
        self.addresses: list[str] = []
        atexit.register(self.stop)
        try:
            for i in range(count):
                self.addresses.append(f"{host}:{free_port(host)}")
                self.log_path(i).write_bytes(b"")
                self.processes.append(self._start(i, model))
        except BaseException:
            self.stop()
            raise

    def _start(self, i: int, model: str | Path) -> subprocess.Popen:
        share, port = self.cores[i], self.addresses[i].rpartition(":")[2]
        env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, share)),
               "OMP_NUM_THREADS": str(len(share)), "PYTHONUNBUFFERED": "1", TOKEN_ENV: self.token,
               PARENT_ENV: str(os.getpid())}
        cmd = [sys.executable, "-m", "grouprl", "serve", "--model", str(model), "--host", self.host, "--port", port,
               *self.root_argv, *self.options]
        with open(self.log_path(i), "ab") as log:  # the child holds its own copy of the file
            return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    preexec_fn=functools.partial(_child_setup, share, os.getpid()))

    def log_path(self, i: int) -> Path:
        return self.log_dir / f"server-{i}.log"

    def describe(self, i: int, settle: float = 0.0) -> str:
        """Server ``i``'s process: running, or its exit status and log's end (``settle``: seconds to wait for it)."""
        try:
            code = self.processes[i].wait(timeout=settle) if settle > 0 else self.processes[i].poll()
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            return f"process {self.processes[i].pid} running, log {self.log_path(i)}"
        tail = self.log_path(i).read_bytes()[-LOG_TAIL_CHARS:].decode(errors="replace").strip()
        return f"process {self.processes[i].pid} exited with status {code}; end of {self.log_path(i)}: {tail}"

    def kill(self, i: int) -> None:
        kill_group(self.processes[i].pid)
        self.processes[i].wait()

    def stop(self) -> None:
        """End every server's process group: SIGTERM, then SIGKILL after a grace period."""
        live = [p for p in self.processes if p.poll() is None]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in live:
            try:
                p.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                kill_group(p.pid)
                p.wait()
        for p in self.processes:  # what the group's leader left behind (vLLM's engine processes)
            kill_group(p.pid)
        atexit.unregister(self.stop)
