"""A reward that runs generated Python against test cases, in a sandboxed child process.

What is enforced, per program:

- a separate process in its own session (its whole process group is killed on timeout), started
  with ``python -I`` (no user site, no PYTHON* variables) in a fresh scratch folder that is its
  working directory, HOME and TMPDIR, with a minimal environment, and deleted afterwards;
- a wall-clock timeout; a runaway program is killed (SIGKILL) and scores 0, and the caller goes on;
- resource limits set with ``resource.setrlimit`` before the program starts: address space
  (memory), CPU seconds, size of any file written (which also caps stdout/stderr, redirected to
  files), open files, no core dumps;
- no network: the child runs in a new network namespace (``unshare --net``, only a down loopback
  device) when the machine allows it; ``network_isolation`` says which guard is active;
- an audit hook (PEP 578, cannot be removed once installed) that refuses sockets, forks,
  subprocesses and exec, and writing, deleting or renaming files outside the scratch folder.

The audit hook is a guard against accidents and runaway code, not a security boundary against
code written to escape (``ctypes`` can get around it, and root inside the sandbox can raise its
own limits): run untrusted code from the open internet inside a container or VM as well.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from grouprl.rewards.builtin import REWARDS, RewardList

CODE_BLOCK = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
DENIED_EVENTS = (
    "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
    "socket.sendto", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
    "subprocess.Popen", "os.kill", "os.killpg",
)
PATH_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
               "os.symlink", "os.link", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move")

# Runs in the child: reads its settings from the first line of stdin (so the program cannot
# re-read them), applies limits, installs the audit hook, runs main.py as __main__, then, in
# assert mode, runs each test against the program's globals and prints "<nonce> passed".
LAUNCHER = r"""
import json, os, resource, runpy, sys
def _launch():
    cfg = json.loads(sys.stdin.readline())
    for name, value in cfg["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (value, value))
    scratch = os.path.realpath(os.getcwd())
    deny, path_events = frozenset(cfg["deny"]), frozenset(cfg["path_events"])
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    def inside(p):
        if isinstance(p, int):
            return True
        try:
            real = os.path.realpath(os.fsdecode(p))
        except (TypeError, ValueError):
            return False
        return real == scratch or real.startswith(scratch + os.sep)
    def hook(event, args):
        if event in deny:
            raise PermissionError("sandbox: " + event + " is not allowed")
        if event == "open" and args[0] is not None:
            mode, flags = str(args[1] or ""), args[2] or 0
            if (set(mode) & set("wax+") or flags & writing) and not inside(args[0]):
                raise PermissionError("sandbox: writing outside the scratch folder is not allowed")
        if event in path_events and not all(inside(a) for a in args if isinstance(a, (str, bytes))):
            raise PermissionError("sandbox: " + event + " outside the scratch folder is not allowed")
    sys.addaudithook(hook)
    sys.argv = ["main.py"]
    env = {"__name__": "__main__"}
    try:
        env = runpy.run_path("main.py", run_name="__main__")
    except SystemExit as e:
        if cfg["tests"] is None or e.code not in (None, 0):
            raise
    if cfg["tests"] is None:
        return
    passed = 0
    for i, test in enumerate(cfg["tests"]):
        try:
            exec(compile(test, "<test %d>" % i, "exec"), env)
            passed += 1
        except BaseException:
            pass
    sys.stdout.flush()
    os.write(1, ("\n%s %d\n" % (cfg["nonce"], passed)).encode())
_launch()
"""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits for one sandboxed program."""

    timeout_s: float = 5.0
    """Wall-clock seconds before the whole process group is killed."""
    memory_mb: int = 512
    """Address-space limit (RLIMIT_AS); allocations beyond it fail with MemoryError."""
    cpu_s: int | None = None
    """CPU-seconds limit (RLIMIT_CPU); None: the timeout rounded up, plus 1."""
    file_mb: float = 8.0
    """Largest file the program may write, stdout and stderr included (RLIMIT_FSIZE)."""
    open_files: int = 64
    """RLIMIT_NOFILE."""

    def rlimits(self) -> dict[str, int]:
        cpu = self.cpu_s if self.cpu_s is not None else int(self.timeout_s) + 2
        return {"RLIMIT_AS": self.memory_mb * 2**20, "RLIMIT_CPU": cpu, "RLIMIT_FSIZE": int(self.file_mb * 2**20),
                "RLIMIT_NOFILE": self.open_files, "RLIMIT_CORE": 0}


@dataclass
class RunResult:
    """What one sandboxed run did."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float


def network_isolation_prefix() -> tuple[list[str], str]:
    """(command prefix, description) of the strongest network isolation this machine allows."""
    unshare = shutil.which("unshare")
    candidates = [["--net"], ["--map-root-user", "--net"]] if unshare else []
    for flags in candidates:
        try:
            ok = subprocess.run([unshare, *flags, "true"], capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return [unshare, *flags], f"network namespace (unshare {' '.join(flags)}) + audit hook"
    return [], "audit hook only (no network namespace available)"


def extract_code(completion: str) -> str:
    """The last fenced code block (```python ... ```), or the whole completion if it has none.

    >>> extract_code("Here:\\n```python\\nprint(1)\\n```\\nDone.")
    'print(1)\\n'
    """
    blocks = CODE_BLOCK.findall(completion)
    return blocks[-1] if blocks else completion


@dataclass
class Sandbox:
    """Runs Python programs under :class:`SandboxLimits` (see the module docstring)."""

    limits: SandboxLimits = field(default_factory=SandboxLimits)
    python: str = sys.executable
    isolate_network: bool = True
    """Use a network namespace where available (the audit hook blocks sockets regardless)."""
    _prefix: list[str] | None = field(default=None, init=False, repr=False)
    network_isolation: str = field(default="", init=False)

    def __post_init__(self) -> None:
        if self.isolate_network:
            self._prefix, self.network_isolation = network_isolation_prefix()
        else:
            self._prefix, self.network_isolation = [], "audit hook only (namespace switched off)"

    def run(self, source: str, stdin: str = "", tests: list[str] | None = None,
            nonce: str | None = None) -> RunResult:
        """Run ``source`` as ``__main__`` with ``stdin``; with ``tests`` (Python snippets, e.g.
        asserts) run each in the program's globals afterwards and print ``"<nonce> <passed>"``."""
        scratch = tempfile.mkdtemp(prefix="grouprl-sandbox-")
        try:
            with open(os.path.join(scratch, "main.py"), "w") as f:
                f.write(source)
            config = {"rlimits": self.limits.rlimits(), "deny": DENIED_EVENTS, "path_events": PATH_EVENTS,
                      "tests": tests, "nonce": nonce}
            payload = (json.dumps(config) + "\n" + stdin).encode()
            return self._execute(scratch, payload)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _execute(self, scratch: str, payload: bytes) -> RunResult:
        env = {"PATH": "/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch, "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
        command = [*(self._prefix or []), self.python, "-I", "-B", "-c", LAUNCHER]
        out_path, err_path = os.path.join(scratch, ".stdout"), os.path.join(scratch, ".stderr")
        start = time.perf_counter()
        timed_out = False
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=scratch, env=env,
                                    start_new_session=True)
            try:
                proc.communicate(payload, timeout=self.limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
        seconds = time.perf_counter() - start
        return RunResult(proc.returncode, _read(out_path), _read(err_path), timed_out, seconds)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's whole session (it may have started threads or, despite the audit
    hook, processes) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _read(path: str, limit: int = 1 << 20) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode(errors="replace")


def _outputs_match(got: str, expected: str) -> bool:
    """Same lines once trailing whitespace and trailing blank lines are ignored."""
    return [line.rstrip() for line in got.rstrip().splitlines()] == \
        [line.rstrip() for line in str(expected).rstrip().splitlines()]


class CodeExecutionReward:
    """Reward = fraction of a row's test cases the completion's code passes (0.0 if it does not
    run, times out or has no code; None where the row has no tests).

    The ``tests`` column holds, per row, either assert snippets run after the program in its
    globals (``["assert add(2, 3) == 5"]``; one process runs them all) or stdin/stdout cases
    (``[{"input": "2 3\\n", "output": "5"}]``; one process per case). Rows run in parallel
    threads, each waiting on its own child process.
    """

    name = "code_execution"

    def __init__(self, limits: SandboxLimits | None = None, workers: int | None = None,
                 isolate_network: bool = True):
        self.sandbox = Sandbox(limits or SandboxLimits(), isolate_network=isolate_network)
        self.workers = workers or max(1, min(4, os.cpu_count() or 1))

    @property
    def network_isolation(self) -> str:
        return self.sandbox.network_isolation

    def score(self, completion: str, tests: list[Any] | None) -> float | None:
        """Fraction of ``tests`` passed by the code in ``completion``."""
        if not tests:
            return None
        code = extract_code(completion)
        if all(isinstance(t, str) for t in tests):
            nonce = secrets.token_hex(16)
            result = self.sandbox.run(code, tests=list(tests), nonce=nonce)
            found = re.findall(rf"^{nonce} (\d+)$", result.stdout, re.MULTILINE)
            return 0.0 if result.timed_out or not found else int(found[-1]) / len(tests)
        if all(isinstance(t, dict) and "output" in t for t in tests):
            passed = 0
            for case in tests:
                result = self.sandbox.run(code, stdin=str(case.get("input", "")))
                passed += (not result.timed_out and result.returncode == 0
                           and _outputs_match(result.stdout, case["output"]))
            return passed / len(tests)
        raise ValueError("tests must be a list of assert snippets (str) or of {'input', 'output'} dicts")

    def __call__(self, prompts: list[Any], completions: list[str], *, tests: list[list[Any] | None]) -> RewardList:
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            return list(pool.map(self.score, completions, tests))


def code_execution_reward(timeout_s: float = 5.0, memory_mb: int = 512, workers: int | None = None,
                          isolate_network: bool = True) -> CodeExecutionReward:
    """:class:`CodeExecutionReward` from flat options (the form a config gives)."""
    return CodeExecutionReward(SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb), workers=workers,
                               isolate_network=isolate_network)


REWARDS.register("code_execution", code_execution_reward)
