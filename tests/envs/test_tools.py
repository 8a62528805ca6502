"""Tool calls: read from the assistant's text, executed with a timeout, and every failure answered as
a tool message the model can read (never an exception)."""

from __future__ import annotations

import asyncio
import time

import pytest

from grouprl.envs import Episode
from grouprl.envs.tools import (
    TOOL_PARSERS,
    Tool,
    ToolCall,
    ToolRunner,
    load_tools,
    parse_hermes,
    resolve_tool_parser,
    tools_system_prompt,
)
from grouprl.errors import ConfigError


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: the dividend.
        b: the divisor.
    """
    return a / b


def sleepy(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: how long.
    """
    time.sleep(seconds)
    return "awake"


async def fetch(key: str) -> str:
    """Look a key up, slowly.

    Args:
        key: what to look up.
    """
    await asyncio.sleep(0.3)
    return key.upper()


def no_docs(x):
    return x


def runner(timeout_s=1.0):
    return ToolRunner([Tool.of(f) for f in (add, divide, sleepy, fetch)], timeout_s)


def call(name, **arguments):
    return ToolCall(name, arguments)


def test_the_schema_comes_from_hints_and_docstring():
    schema = Tool.of(add).schema["function"]
    assert schema["name"] == "add" and schema["description"] == "Add two integers."
    assert schema["parameters"]["properties"]["a"] == {"type": "integer", "description": "the first."}
    assert schema["parameters"]["required"] == ["a", "b"]


def test_a_function_without_a_docstring_is_refused_by_name():
    with pytest.raises(ConfigError, match="tool 'no_docs' cannot be described"):
        Tool.of(no_docs)


def test_hermes_calls_are_parsed_with_their_arguments():
    text = ('Let me add. <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call> and '
            '<tool_call>{"name": "divide", "arguments": "{\\"a\\": 1, \\"b\\": 4}"}</tool_call>')
    assert parse_hermes(text) == [call("add", a=2, b=3), call("divide", a=1, b=4)]
    assert parse_hermes("no call here") == []
    # a turn that stopped right after the JSON, and a Python-literal dict
    assert parse_hermes('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}') == [call("add", a=1, b=1)]
    assert parse_hermes("<tool_call>{'name': 'add', 'arguments': {'a': 1, 'b': 2}}</tool_call>") == \
        [call("add", a=1, b=2)]


@pytest.mark.parametrize("body, error", [
    ("{oops", "not valid JSON"),
    ('["add"]', 'a tool call is {"name"'),
    ('{"name": "add", "arguments": [1, 2]}', "arguments must be a JSON object"),
    ("{'name': __import__('os').getcwd()}", "not valid JSON"),  # a literal, never evaluated code
])
def test_malformed_calls_carry_the_reason(body, error):
    (parsed,) = parse_hermes(f"<tool_call>{body}</tool_call>")
    assert parsed.error is not None and error in parsed.error


def test_every_outcome_becomes_a_tool_message_and_the_run_goes_on():
    calls = [call("add", a=2, b=3), ToolCall(None, {}, "the tool call is not valid JSON: {oops"),
             call("subtract", a=1), call("add", a=1), call("divide", a=1, b=0)]
    results = runner().run(calls)
    assert results[0] == ("add", "5", False)
    assert results[1] == ("error", "error: the tool call is not valid JSON: {oops", True)
    assert results[2][2] and "there is no tool 'subtract'; the tools are: add, divide, sleepy, fetch" in results[2][1]
    assert results[3][2] and "bad arguments for add" in results[3][1] and "'b'" in results[3][1]
    assert results[4] == ("divide", "error: divide raised ZeroDivisionError: division by zero", True)


def test_a_slow_tool_times_out_as_an_error_message():
    start = time.perf_counter()
    results = runner(timeout_s=0.2).run([call("sleepy", seconds=30.0), call("add", a=1, b=1)])
    assert time.perf_counter() - start < 15  # not the tool's 30 s: a bound that holds on a loaded machine
    assert results == [("sleepy", "error: sleepy took longer than 0.2 s", True), ("add", "2", False)]


def test_async_tools_run_concurrently():
    start = time.perf_counter()
    results = runner().run([call("fetch", key="a"), call("fetch", key="b"), call("fetch", key="c")])
    assert [r[1] for r in results] == ["A", "B", "C"]
    assert time.perf_counter() - start < 0.8  # three 0.3 s calls, together


def test_long_results_are_cut_and_say_so():
    def shout(text: str) -> str:
        """Repeat.

        Args:
            text: what.
        """
        return text * 5000

    (name, message, failed), = ToolRunner([Tool.of(shout)], 1.0).run([call("shout", text="ab")])
    assert not failed and len(message) < 2100 and message.endswith("more chars]")


def test_tools_by_import_path_and_the_python_tool():
    tools = load_tools(["tests.envs.test_tools:add", "python"])
    assert [t.name for t in tools] == ["add", "python"]
    with pytest.raises(ConfigError, match="has no attribute 'nope'"):
        load_tools(["tests.envs.test_tools:nope"])
    with pytest.raises(ConfigError, match="two tools share a name"):
        load_tools(["tests.envs.test_tools:add", "tests.envs.test_tools:add"])


def test_the_python_tool_runs_in_the_sandbox():
    (python,) = load_tools(["python"])
    assert python.fn(code="print(6 * 7)").strip() == "42"
    assert "ZeroDivisionError" in python.fn(code="1 / 0")


def test_the_system_prompt_lists_the_schemas_and_the_format():
    text = tools_system_prompt([Tool.of(add)])
    assert '"name": "add"' in text and "<tool_call>" in text
    assert "hermes" in TOOL_PARSERS


def parse_calc(text: str) -> list[ToolCall]:
    """``CALC a b`` calls add(a, b): a model-specific format a user brings."""
    if not text.startswith("CALC "):
        return []
    a, b = text.split()[1:3]
    return [ToolCall("add", {"a": int(a), "b": int(b)})]


class Silent:
    def reset(self, *, seed=None, options=None):
        return "add two numbers", {}

    def step(self, action):
        return "done", 1.0, True, False, {}


def test_a_tool_parser_by_import_path_or_registered_name_reads_the_calls():
    assert resolve_tool_parser("tests.envs.test_tools:parse_calc") is parse_calc
    assert resolve_tool_parser(__file__ + ":parse_calc")("CALC 1 2") == [ToolCall("add", {"a": 1, "b": 2})]
    if "calc" not in TOOL_PARSERS:
        TOOL_PARSERS.register("calc", parse_calc)
    for spec in ("calc", "tests.envs.test_tools:parse_calc"):
        ep = Episode(Silent(), [Tool.of(add)], tool_parser=spec)
        ep.start()
        assert ep.respond("CALC 2 3") == [{"role": "tool", "name": "add", "content": "5"}]
        # a hermes call is plain text to this parser: the environment gets it as the answer
        assert ep.respond('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>') is None
        assert (ep.tool_calls, ep.return_) == (1, 1.0)


def test_a_wrong_tool_parser_is_refused_by_field():
    with pytest.raises(ConfigError, match="tool_parser: unknown tool parser 'hermz' .did you mean 'hermes'"):
        resolve_tool_parser("hermz")
    with pytest.raises(ConfigError, match="tool_parser 'tests.envs.test_tools:__doc__' is a str, not a function"):
        resolve_tool_parser("tests.envs.test_tools:__doc__")
    with pytest.raises(ConfigError, match="has no attribute 'nope'"):
        resolve_tool_parser("tests.envs.test_tools:nope")
