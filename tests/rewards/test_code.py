"""The sandboxed code-execution reward: grading, limits, isolation, and the caller going on."""

import glob
import os
import tempfile
import time

import pytest

from grouprl.rewards import CodeExecutionReward, Sandbox, SandboxLimits, make_reward, score_rewards
from grouprl.rewards.code import extract_code

ADD_TESTS = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0", "assert add(10, 0) == 10"]


def block(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```\nIt adds."


@pytest.fixture(scope="module")
def reward():
    return CodeExecutionReward(SandboxLimits(timeout_s=10.0, memory_mb=256), workers=2)


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(SandboxLimits(timeout_s=10.0, memory_mb=256))


def test_asserts_are_graded_as_the_fraction_passed(reward):
    completions = [
        block("def add(a, b):\n    return a + b"),
        block("def add(a, b):\n    return a + b if a >= 0 else 99"),  # fails the second test only
        block("def add(a, b) return"),  # syntax error
        "I cannot do that.",
    ]
    assert reward(None, completions, tests=[ADD_TESTS] * 4) == [1.0, pytest.approx(2 / 3), 0.0, 0.0]


def test_stdin_stdout_cases(reward):
    cases = [{"input": "2 3\n", "output": "5"}, {"input": "7 8", "output": "15\n"}]
    solved = block("a, b = map(int, input().split())\nprint(a + b)")
    assert reward(None, [solved, block("print(5)")], tests=[cases, cases]) == [1.0, 0.5]


def test_rows_without_tests_do_not_apply(reward):
    assert reward(None, [block("x = 1"), block("x = 1")], tests=[None, []]) == [None, None]
    with pytest.raises(ValueError, match="assert snippets"):
        reward.score(block("x = 1"), [1, 2])


def test_exiting_early_does_not_pass_the_tests(reward):
    early = [block("import sys\nsys.exit(0)\ndef add(a, b): return a + b"),
             block("import os\nos._exit(0)"),
             block("print('0 3')\ndef add(a, b): return 42")]  # printing a fake score line
    assert reward(None, early, tests=[ADD_TESTS] * 3) == [0.0, 0.0, 0.0]


def test_runaway_program_is_killed_scored_zero_and_the_batch_goes_on():
    quick = CodeExecutionReward(SandboxLimits(timeout_s=2.0), workers=2)
    completions = [block("def add(a, b):\n    while True:\n        pass"), block("def add(a, b):\n    return a + b"),
                   block("import time\ntime.sleep(30)")]
    start = time.perf_counter()
    assert quick(None, completions, tests=[ADD_TESTS] * 3) == [0.0, 1.0, 0.0]
    assert time.perf_counter() - start < 15.0  # two 2 s timeouts on two workers, not 30 s of sleep


def test_memory_limit(sandbox):
    result = sandbox.run("x = bytearray(1024 ** 3)\nprint('allocated')")
    assert result.returncode != 0 and "MemoryError" in result.stderr and "allocated" not in result.stdout


def test_output_flood_is_cut_by_the_file_size_limit():
    small = Sandbox(SandboxLimits(timeout_s=5.0, file_mb=0.1))
    result = small.run("import sys\nwhile True:\n    sys.stdout.write('y' * 4096)")
    assert not result.timed_out and result.returncode != 0  # killed by SIGXFSZ, not the clock
    assert len(result.stdout) <= 0.1 * 2**20


@pytest.mark.parametrize(("source", "refused"), [
    ("import socket\nsocket.socket()", "socket.__new__"),
    ("import urllib.request\nurllib.request.urlopen('http://example.com')", "socket"),
    ("import os\nos.system('echo hi')", "os.system"),
    ("import subprocess\nsubprocess.run(['true'])", "subprocess.Popen"),
    ("import os\nos.fork()", "os.fork"),
])
def test_network_processes_and_forks_are_refused(sandbox, source, refused):
    result = sandbox.run(source)
    assert result.returncode != 0
    assert "PermissionError: sandbox:" in result.stderr and refused in result.stderr


def test_network_namespace_has_only_loopback(sandbox):
    if "namespace" not in sandbox.network_isolation or "only" in sandbox.network_isolation:
        pytest.skip(f"no network namespace on this machine: {sandbox.network_isolation}")
    result = sandbox.run("print(open('/proc/net/dev').read())")
    interfaces = [line.split(":")[0].strip() for line in result.stdout.splitlines()[2:] if ":" in line]
    assert interfaces == ["lo"]


def test_files_only_in_the_scratch_folder_which_is_removed(sandbox):
    outside = os.path.join(tempfile.gettempdir(), "grouprl-sandbox-escape.txt")
    result = sandbox.run(f"open({outside!r}, 'w').write('x')")
    assert "writing outside the scratch folder" in result.stderr and not os.path.exists(outside)
    result = sandbox.run("import os\nopen('notes.txt', 'w').write('ok')\nprint(open('notes.txt').read(), os.getcwd())")
    assert result.returncode == 0 and result.stdout.startswith("ok ")
    scratch = result.stdout.split()[1]
    assert "grouprl-sandbox-" in scratch and not os.path.exists(scratch)
    assert sandbox.run("import shutil\nshutil.rmtree('/tmp/anything')").returncode != 0


def test_stdin_cannot_reveal_the_launcher_settings(sandbox):
    result = sandbox.run("import sys\nprint(repr(sys.stdin.read()))", stdin="abc")
    assert result.stdout.strip() == "'abc'"


def test_usable_by_name_in_a_reward_list():
    fn = make_reward("code_execution", timeout_s=10.0)
    scores = score_rewards([fn], None, ["p", "p"], [block("def add(a, b): return a + b"), "no code"],
                           columns={"tests": [ADD_TESTS, ADD_TESTS]})
    assert scores.per_fn["code_execution"].tolist() == [1.0, 0.0]
    assert glob.glob(os.path.join(tempfile.gettempdir(), "grouprl-sandbox-*")) == []


def test_extract_code():
    assert extract_code("a\n```py\nx = 1\n```\nb\n```python\ny = 2\n```") == "y = 2\n"
    assert extract_code("print(3)") == "print(3)"
