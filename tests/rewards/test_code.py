"""The code-execution reward: grading outside the program, limits, and a sandbox tested with hostile
programs (each one a way a policy under RL could raise its reward or hurt the trainer)."""

import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from grouprl.errors import ConfigError
from grouprl.rewards import CodeExecutionReward, Sandbox, SandboxLimits, make_reward, score_rewards
from grouprl.rewards.code import extract_code, parse_assert, parse_case

ADD_TESTS = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0", "assert add(10, 0) == 10"]


def block(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```\nIt adds."


@pytest.fixture(scope="module")
def reward():
    return CodeExecutionReward(SandboxLimits(timeout_s=10.0, memory_mb=256), workers=2)


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(SandboxLimits(timeout_s=10.0, memory_mb=256))


# --------------------------------------------------------------------------- grading


def test_asserts_are_graded_as_the_fraction_passed(reward):
    completions = [
        block("def add(a, b):\n    return a + b"),
        block("def add(a, b):\n    return a + b if a >= 0 else 99"),  # fails the second test only
        block("def add(a, b) return"),  # syntax error
        "I cannot do that.",
    ]
    assert reward(None, completions, tests=[ADD_TESTS] * 4) == [1.0, pytest.approx(2 / 3), 0.0, 0.0]


def test_call_cases_and_stdin_cases(reward):
    calls = [{"call": "pair", "args": [1, 2], "expected": [1, 2]}, {"call": "pair", "args": [3, 4], "expected": [3, 4]}]
    assert reward(None, [block("def pair(a, b): return [a, b]"), block("def pair(a, b): return (a, b)")],
                  tests=[calls, calls]) == [1.0, 0.0]  # == as the test's own assert: a tuple is not a list
    cases = [{"input": "2 3\n", "output": "5"}, {"input": "7 8", "output": "15\n"}]
    solved = block("a, b = map(int, input().split())\nprint(a + b)")
    assert reward(None, [solved, block("print(5)")], tests=[cases, cases]) == [1.0, 0.5]


def test_rows_without_tests_do_not_apply_and_bad_tests_are_refused(reward):
    assert reward(None, [block("x = 1"), block("x = 1")], tests=[None, []]) == [None, None]
    with pytest.raises(ValueError, match="test case 1"):
        reward(None, [block("x = 1")], tests=[[1, 2]])
    with pytest.raises(ValueError, match="cannot be scored outside the program"):
        reward(None, [block("x = 1")], tests=[["assert abs(f(1) - 2) < 1e-9"]])


def test_parse_assert_reads_literals_only():
    assert parse_assert("assert 5 == add(2, 3)").expected == 5
    assert parse_case({"call": "f", "args": [1], "expected": None}).args == (1,)
    with pytest.raises(ValueError):
        parse_assert("assert add(__import__('os').getpid(), 1) == 2")


def test_exiting_early_does_not_pass_the_tests(reward):
    early = [block("import sys\nsys.exit(0)\ndef add(a, b): return a + b"),
             block("import os\nos._exit(0)"),
             block("print('0 3')\ndef add(a, b): return 42")]
    assert reward(None, early, tests=[ADD_TESTS] * 3) == [0.0, 0.0, 0.0]


# --------------------------------------------------------------------------- hostile programs: forged scores


@pytest.mark.parametrize("source", [
    # walk the frames to the harness, find its marker and print a report of its own
    "import sys, json\nf = sys._getframe()\nwhile f and 'spec' not in f.f_locals: f = f.f_back\n"
    "spec = f.f_locals['spec']\nprint('\\n' + spec['marker'] + json.dumps(['1000'] * len(spec['calls'])))\n"
    "import os\nos._exit(0)",
    # replace the builtins the grader would have used
    "import builtins\nbuiltins.exec = lambda *a, **k: None\nbuiltins.eval = lambda *a, **k: True\n"
    "def add(a, b): return -7",
    # answer every call with an object that compares equal to anything
    "class Yes:\n    def __eq__(self, o): return True\n    def __repr__(self): return 'True'\n"
    "def add(a, b): return Yes()",
    # print a report after the harness's own, at exit
    "import atexit, sys\natexit.register(lambda: print('\\x00grouprl-calls-0:[\"5\", \"0\", \"10\"]'))\n"
    "def add(a, b): return -7",
])
def test_scores_cannot_be_forged_from_inside(reward, source):
    assert reward(None, [block(source)], tests=[ADD_TESTS]) == [0.0]


# --------------------------------------------------------------------------- hostile programs: the machine


def test_commands_and_files_outside_cannot_be_touched(sandbox, tmp_path):
    target = tmp_path / "escape.txt"
    for source in [
        f"import _posixsubprocess, os\nos.system('touch {target}')",
        f"import subprocess\nsubprocess.run(['/bin/sh', '-c', 'echo x > {target}'])",
        f"import sqlite3\nsqlite3.connect({str(target)!r}).execute('create table t (x)')",
        f"import ctypes\nlibc = ctypes.CDLL(None)\nfd = libc.open({str(target).encode()!r}, 0o101, 0o644)\n"
        "libc.write(fd, b'x', 1)",
        f"open({str(target)!r}, 'w').write('x')",
    ]:
        sandbox.run(source)
        assert not target.exists(), source
    result = sandbox.run("import os\nprint(sorted(os.listdir('/')))\nopen('/usr/x', 'w')")
    assert "tmp" in result.stdout and "work" not in result.stdout and "root" not in result.stdout
    assert "Read-only file system" in result.stderr


def test_the_trainer_cannot_be_signalled_and_its_secrets_are_not_visible(sandbox, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    me = os.getpid()
    for source in [
        "import os, signal\nfd = os.pidfd_open(os.getppid())\nsignal.pidfd_send_signal(fd, signal.SIGKILL)",
        f"import os, signal\nos.kill({me}, signal.SIGKILL)",
        f"import ctypes\nctypes.CDLL(None).kill({me}, 9)",
        "import os, signal\nos.kill(-1, signal.SIGKILL)",
    ]:
        sandbox.run(source)
    result = sandbox.run(f"import os\nprint(os.environ)\nprint(os.listdir('/proc'))\n"
                         f"print(open('/proc/{me}/environ').read())")
    assert "hf_secret_value" not in result.stdout + result.stderr
    assert "FileNotFoundError" in result.stderr  # the trainer's pid does not exist in there
    assert os.getpid() == me  # still alive


def test_no_network(sandbox):
    result = sandbox.run("import socket\ns = socket.create_connection(('1.1.1.1', 53), timeout=2)")
    assert result.returncode != 0 and "OSError" in result.stderr
    interfaces = sandbox.run("print(open('/proc/net/dev').read())").stdout
    assert [line.split(":")[0].strip() for line in interfaces.splitlines()[2:] if ":" in line] == ["lo"]


def test_runs_as_an_unprivileged_user_in_its_own_process_tree(sandbox):
    result = sandbox.run("import os\nprint(os.getuid(), os.getgid(), os.getpid())")
    uid, gid, pid = map(int, result.stdout.split())
    assert (uid, gid) == (65534, 65534) and pid < 10


def test_a_detached_grandchild_dies_with_the_timeout(tmp_path):
    quick = Sandbox(SandboxLimits(timeout_s=2.0))
    marker = "grouprl-orphan-" + os.urandom(4).hex()
    source = (f"import os, time, ctypes\nlibc = ctypes.CDLL(None)\nif libc.fork() == 0:\n    libc.setsid()\n"
              f"    os.execv('/bin/sleep', ['/bin/sleep', '300', '{marker}'])\ntime.sleep(60)")
    result = quick.run(source)
    assert result.timed_out
    time.sleep(0.5)
    alive = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    for pid in alive:
        os.kill(int(pid), signal.SIGKILL)
    assert alive == []


def test_fork_bombs_are_bounded(sandbox):
    start = time.perf_counter()
    result = Sandbox(SandboxLimits(timeout_s=5.0, processes=8)).run(
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        os.write(1, b'refused')\n"
        "        os._exit(0)")
    assert "refused" in result.stdout and time.perf_counter() - start < 10


def test_runaway_program_is_killed_scored_zero_and_the_batch_goes_on():
    quick = CodeExecutionReward(SandboxLimits(timeout_s=2.0), workers=2)
    completions = [block("def add(a, b):\n    while True:\n        pass"), block("def add(a, b):\n    return a + b"),
                   block("import time\ntime.sleep(30)")]
    start = time.perf_counter()
    assert quick(None, completions, tests=[ADD_TESTS] * 3) == [0.0, 1.0, 0.0]
    assert time.perf_counter() - start < 15.0


def test_memory_limit(sandbox):
    result = sandbox.run("x = bytearray(1024 ** 3)\nprint('allocated')")
    assert result.returncode != 0 and "MemoryError" in result.stderr and "allocated" not in result.stdout


def test_output_flood_is_cut_by_the_file_size_limit():
    small = Sandbox(SandboxLimits(timeout_s=5.0, file_mb=0.1))
    result = small.run("import sys\nwhile True:\n    sys.stdout.write('y' * 4096)")
    assert not result.timed_out and result.returncode != 0
    assert len(result.stdout) <= 0.1 * 2**20


def test_scratch_is_writable_capped_and_gone_afterwards(sandbox):
    result = sandbox.run("import os\nopen('notes.txt', 'w').write('ok')\nprint(open('notes.txt').read(), os.getcwd())")
    assert result.stdout.split() == ["ok", "/tmp"]
    assert "left" not in sandbox.run("import os\nprint('left' if os.path.exists('notes.txt') else '')").stdout
    full = Sandbox(SandboxLimits(timeout_s=10.0, scratch_mb=4, file_mb=64)).run(
        "open('big', 'wb').write(b'x' * 8 * 2**20)")
    assert "No space left on device" in full.stderr


def test_stdin_cannot_reveal_the_harness_settings(sandbox):
    result = sandbox.run("import sys\nprint(repr(sys.stdin.read()))", stdin="abc")
    assert result.stdout.strip() == "'abc'"


# --------------------------------------------------------------------------- where isolation is missing


def test_without_bubblewrap_it_refuses_unless_unsafe_is_asked_for(monkeypatch):
    import grouprl.rewards.sandbox as sb

    monkeypatch.setattr(sb, "find_bwrap", lambda: None)
    with pytest.raises(ConfigError, match="needs bubblewrap.*isolation: unsafe"):
        Sandbox()
    unsafe = CodeExecutionReward(isolation="unsafe")
    assert unsafe.isolation.startswith("UNSAFE")
    assert unsafe(None, [block("def add(a, b): return a + b")], tests=[ADD_TESTS]) == [1.0]


def test_a_machine_without_user_namespaces_gets_the_reason(monkeypatch):
    import grouprl.rewards.sandbox as sb

    monkeypatch.setattr(sb, "find_bwrap", lambda: "/bin/false")
    with pytest.raises(ConfigError, match="cannot isolate programs on this machine"):
        Sandbox()


def test_usable_by_name_in_a_reward_list():
    fn = make_reward("code_execution", timeout_s=10.0)
    assert fn.isolation.startswith("bubblewrap")
    scores = score_rewards([fn], None, ["p", "p"], [block("def add(a, b): return a + b"), "no code"],
                           columns={"tests": [ADD_TESTS, ADD_TESTS]})
    assert scores.per_fn["code_execution"].tolist() == [1.0, 0.0]


def test_extract_code():
    assert extract_code("a\n```py\nx = 1\n```\nb\n```python\ny = 2\n```") == "y = 2\n"
    assert extract_code("print(3)") == "print(3)"


def test_sandbox_temporary_folders_are_removed(sandbox):
    before = set(os.listdir(tempfile.gettempdir()))
    sandbox.run("print(1)")
    assert {p for p in set(os.listdir(tempfile.gettempdir())) - before if p.startswith("grouprl-sandbox-")} == set()
    assert sys.executable  # the trainer's own interpreter is untouched


def test_a_run_names_how_its_code_reward_isolates_programs(tmp_path):
    """The trainer's setup (printed at start, in summary.json, in the report) says what isolates the code."""
    from grouprl.trainer.trainer import run_setup

    setup = run_setup([make_reward("code_execution"), CodeExecutionReward(isolation="unsafe"), len])
    assert setup["isolation/code_execution"].startswith("bubblewrap")
    assert setup["isolation/code_execution_2"].startswith("UNSAFE")
    assert len(setup) == 2


def test_an_unsafe_run_says_so_at_start_in_its_summary_and_in_its_report(tmp_path, capsys):
    import json

    from grouprl.cli import main

    data = tmp_path / "code.jsonl"
    rows = [{"prompt": f"Write f(x) returning x + {i}.", "tests": [f"assert f(1) == {i + 1}"]} for i in range(4)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "run"
    status = main(["train", "--model", "tiny", "--dataset", str(data), "--reward_functions", "code_execution",
                   "--reward_options", "{code_execution: {isolation: unsafe}}", "--prompts_per_step", "2",
                   "--group_size", "2", "--max_new_tokens", "4", "--total_steps", "1", "--eval_size", "0",
                   "--no-progress", "--output_dir", str(out)])
    assert status == 0
    assert "isolation/code_execution: UNSAFE" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["setup"]["isolation/code_execution"].startswith("UNSAFE")
    assert "UNSAFE" in (out / "report" / "report.html").read_text()


def test_a_private_tmpdir_does_not_stop_the_sandbox(tmp_path, monkeypatch):
    """Programs run as nobody when the trainer is root: a TMPDIR only its owner can pass through is not where their
    folders go (bubblewrap, started as nobody, could not bind them); where nothing shared is writable, the error says
    what to change."""
    from grouprl.rewards import sandbox as sandboxes

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    sandbox = Sandbox(SandboxLimits(timeout_s=10.0, memory_mb=256))
    assert sandbox.run("print(6 * 7)").stdout.strip() == "42"
    assert sandboxes._scratch_root(False) == str(private)  # a sandbox that runs as its owner keeps TMPDIR
    assert not sandboxes._scratch_root(True).startswith(str(private))
    monkeypatch.setattr(sandboxes.os, "access", lambda path, mode: False)
    with pytest.raises(ConfigError, match=rf"cannot reach the temporary folder {private} \(a private TMPDIR\)"):
        sandboxes._scratch_root(True)
