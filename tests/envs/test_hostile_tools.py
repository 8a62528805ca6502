"""Tools that misbehave, and tool-call text written to break the parser: every outcome is a tool message
the model reads, the run goes on, calls of different trajectories run at once, and no tool's process
outlives its call or holds up the exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grouprl.envs import Episode, Tool
from grouprl.envs.tools import ToolCall, ToolRunner, parse_hermes
from grouprl.rollout.agent import AgentSampler, ChatRenderer
from grouprl.rollout.turns import TurnLimits
from grouprl.types import SamplingParams
from tests.envs.test_tools import add


def exits(code: int) -> str:
    """Exit the process.

    Args:
        code: the status.
    """
    raise SystemExit(code)


def interrupts(code: int) -> str:
    """Raise KeyboardInterrupt.

    Args:
        code: unused.
    """
    raise KeyboardInterrupt


def hard_exit(code: int) -> str:
    """Leave without cleanup.

    Args:
        code: the status.
    """
    os._exit(code)


def crashes(code: int) -> str:
    """Die of a signal.

    Args:
        code: unused.
    """
    os.kill(os.getpid(), signal.SIGKILL)


def hangs(code: int) -> str:
    """Never return.

    Args:
        code: unused.
    """
    while True:
        time.sleep(60)


def children() -> set[int]:
    """Pids of this process's living child processes (zombies included: a child not reaped yet counts)."""
    me, found = os.getpid(), set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == me:
                found.add(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_a_tool_that_exits_or_dies_is_an_error_message_and_the_run_goes_on():
    runner = ToolRunner([Tool.of(f) for f in (exits, interrupts, hard_exit, crashes, add)], timeout_s=20.0)
    results = runner.run([ToolCall("exits", {"code": 3}), ToolCall("interrupts", {"code": 0}),
                          ToolCall("hard_exit", {"code": 3}), ToolCall("crashes", {"code": 0}),
                          ToolCall("add", {"a": 2, "b": 3})])
    assert results == [
        ("exits", "error: exits raised SystemExit: 3", True),
        ("interrupts", "error: interrupts raised KeyboardInterrupt: ", True),
        ("hard_exit", "error: hard_exit ended without an answer (exit status 3)", True),
        ("crashes", f"error: crashes ended without an answer (exit status {-signal.SIGKILL})", True),
        ("add", "5", False),
    ]


def test_tool_calls_of_different_trajectories_run_at_once_and_a_hung_tool_is_killed():
    """8 trajectories, each turn a call to a tool that never returns, 2 s allowed: one after another
    would take 8 x 2 = 16 s; together about 2 s. The bound is half the sequential time."""
    from grouprl.models import tiny_causal_lm

    class Echo:
        def reset(self, *, seed=None, options=None):
            return "call the tool", {}

        def step(self, action):
            return "done", 0.0, True, False, {}

    timeout, trajectories = 2.0, 8
    model, tok = tiny_causal_lm(seed=0)
    sampler = AgentSampler(model, tok, ChatRenderer(tok), TurnLimits(2, 1, 32))
    always_calls = lambda text: [ToolCall("hangs", {"code": 0})]  # noqa: E731 - every turn calls the tool
    episodes = [Episode(Echo(), [Tool.of(hangs)], seed=i // 2, tool_parser=always_calls, tool_timeout_s=timeout)
                for i in range(trajectories)]
    before = children()
    start = time.perf_counter()
    batch = sampler.generate(episodes, 2, SamplingParams(max_new_tokens=2, temperature=1.0), seed=0)
    took = time.perf_counter() - start
    assert took < trajectories * timeout / 2, f"{took:.1f} s for {trajectories} calls of {timeout} s"
    assert all(m[-1]["content"] == f"error: hangs took longer than {timeout:g} s" for m in batch.extras["trajectory"])
    assert children() - before == set(), "a tool's process outlived its call"


SCRIPT = textwrap.dedent("""
    import os, sys, time
    from grouprl.envs import Tool
    from grouprl.envs.tools import ToolCall, ToolRunner

    def stuck(path: str) -> str:
        '''Record the pid, then never return.

        Args:
            path: where to write the pid.
        '''
        with open(path, "w") as f:
            f.write(str(os.getpid()))
        while True:
            time.sleep(60)

    result = ToolRunner([Tool.of(stuck)], timeout_s=1.0).run([ToolCall("stuck", {"path": sys.argv[1]})])
    print(result[0][1], flush=True)
""")


@pytest.mark.slow
def test_a_tool_that_never_returns_does_not_hold_up_the_exit(tmp_path):
    pid_file = tmp_path / "pid"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(pid_file)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "error: stuck took longer than 1 s"
    with pytest.raises(ProcessLookupError):  # the tool's process is gone with its call
        os.kill(int(pid_file.read_text()), 0)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("body, error", [
    ('{"name": "add", "arguments": {"a": ' + nested(1000) + ', "b": 1}}', "not valid JSON"),
    ('{"name": "add", "arguments": {"a": ' + "9" * 5000 + ', "b": 1}}', "not valid JSON"),
    ('{"name": "add", "arguments": "{\\"a\\": ' + nested(1000) + '}"}', "arguments must be a JSON object"),
    ('{"name": "add", "arguments": "{\\"a\\": ' + "9" * 5000 + '}"}', "arguments must be a JSON object"),
])
def test_deep_or_huge_json_is_a_malformed_call(body, error):
    (parsed,) = parse_hermes(f"<tool_call>{body}</tool_call>")
    assert parsed.error is not None and error in parsed.error


class Answers:
    """Ends on the first answer that is not a tool call."""

    def reset(self, *, seed=None, options=None):
        return "q", {}

    def step(self, action):
        return "ok", 1.0, True, False, {}


TOOL_TEXT = st.one_of(
    st.text(max_size=300),
    st.builds(lambda s: f"<tool_call>{s}</tool_call>", st.text(max_size=300)),
    st.builds(lambda d: "<tool_call>" + json.dumps(d) + "</tool_call>",
              st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                        max_size=4), max_leaves=20)),
    st.builds(lambda args: '<tool_call>{"name": "add", "arguments": ' + json.dumps(args) + "}</tool_call>",
              st.dictionaries(st.sampled_from(["a", "b", "c", ""]), st.integers() | st.text(max_size=5), max_size=3)),
    st.builds(lambda n, big: f'<tool_call>{{"name": "add", "arguments": {{"a": {"[" * n}1{"]" * n}, '
                             f'"b": {"9" * big}}}}}</tool_call>', st.integers(0, 3000), st.integers(1, 6000)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TOOL_TEXT)
def test_whatever_the_policy_writes_is_at_worst_a_tool_error(text):
    episode = Episode(Answers(), [Tool.of(add)], seed=0, tool_timeout_s=20.0)
    episode.start()
    reply = episode.respond(text)
    if reply is None:  # no call was read: the environment took the turn as an answer
        assert episode.end_reason == "env" and episode.tool_calls == 0
    else:
        assert all(m["role"] == "tool" and isinstance(m["content"], str) for m in reply)
        assert episode.tool_calls == len(reply) and episode.end_reason is None
