"""Tools the policy may call: plain Python callables described by their type hints and docstring
(``transformers.utils.get_json_schema``), read from a turn by a parser of :data:`TOOL_PARSERS`::

    <tool_call>{"name": "calculator", "arguments": {"expression": "23 * 47"}}</tool_call>

Every call gets one ``tool`` message, never an exception. Each runs in a forked process group killed at its
deadline, so a hung tool holds up nothing; a tool must not use the accelerator or torch's thread pools.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import os
import re
import select
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from grouprl.errors import ConfigError
from grouprl.registry import Registry, import_object

RESULT_CHARS = 2000  # a longer tool result is cut, saying so
NAME_CHARS = 100  # of an unknown tool name the policy wrote, this much is repeated back


@dataclass(frozen=True)
class Tool:
    """One callable tool and its JSON schema (``{"type": "function", "function": {...}}``)."""

    fn: Callable[..., Any]
    schema: dict[str, Any]

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]

    @classmethod
    def of(cls, fn: Callable[..., Any]) -> Tool:
        """The tool of ``fn``; an error naming it when its docstring or hints cannot make a schema."""
        from transformers.utils import get_json_schema

        name = getattr(fn, "__name__", repr(fn))
        try:
            schema = get_json_schema(fn)
        except Exception as e:  # noqa: BLE001 - transformers raises several kinds; all mean the same here
            raise ConfigError(f"tool {name!r} cannot be described to the model: {e} (give it type hints and a "
                              "docstring whose Args: section names every argument)") from e
        return cls(fn, schema)


@dataclass(frozen=True)
class ToolCall:
    """One call read from an assistant turn, or why it could not be read."""
    name: str | None
    arguments: dict[str, Any]
    error: str | None = None


ToolParser = Callable[[str], list[ToolCall]]
TOOL_PARSERS: Registry[ToolParser] = Registry("tool parser")
"""name -> ``fn(assistant text) -> calls`` (empty when the turn calls no tool)."""

HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def parse_hermes(text: str) -> list[ToolCall]:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (an unclosed last one too; a Python
    dict literal is read like JSON).

    >>> parse_hermes('x <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>')
    [ToolCall(name='f', arguments={'a': 1}, error=None)]
    >>> parse_hermes("<tool_call>{oops</tool_call>")[0].error
    'the tool call is not valid JSON: {oops'
    """
    calls = []
    for body in HERMES.findall(text):
        body = body.strip()
        data = _json_or_literal(body)
        if data is None:
            calls.append(ToolCall(None, {}, f"the tool call is not valid JSON: {body[:200]}"))
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            calls.append(ToolCall(None, {}, 'a tool call is {"name": "<tool>", "arguments": {...}}'))
            continue
        args = data.get("arguments", {})
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):
                args = None
        if not isinstance(args, dict):
            calls.append(ToolCall(data["name"], {}, "the tool call's arguments must be a JSON object"))
            continue
        calls.append(ToolCall(data["name"], args))
    return calls


def _json_or_literal(text: str) -> Any:
    """``text`` as JSON, else as a Python literal (small models write ``{'name': ...}``; no code runs), else None.

    >>> _json_or_literal("{'a': [1, 2]}"), _json_or_literal("{1: f()}")
    ({'a': [1, 2]}, None)
    """
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # not JSON, too deep, or an integer past Python's digit limit
        pass
    if len(text) > 10_000:  # literal_eval's parser is recursive: a deeply nested input could exhaust the stack
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


TOOL_PARSERS.register("hermes", parse_hermes)


def resolve_tool_parser(spec: str) -> ToolParser:
    """The parser ``spec`` names: in :data:`TOOL_PARSERS`, or an import path of ``(text) -> list[ToolCall]``."""
    if ":" not in spec:
        try:
            return TOOL_PARSERS.get(spec)
        except ValueError as e:
            raise ConfigError(f"tool_parser: {e}") from e
    parser = import_object(spec, "tool_parser")
    if not callable(parser):
        raise ConfigError(f"tool_parser {spec!r} is a {type(parser).__name__}, not a function (text -> list[ToolCall])")
    return parser


def tools_system_prompt(tools: Sequence[Tool]) -> str:
    """The tools described in a system message, for chat templates that ignore ``tools=``."""
    listing = "\n".join(json.dumps(t.schema["function"]) for t in tools)
    return ("You can call these tools:\n" + listing + "\n\nTo call a tool, write only\n"
            '<tool_call>{"name": "<tool name>", "arguments": {<its arguments>}}</tool_call>\n'
            "and its result comes back in the next message. When you know the answer, write it without a "
            "tool call.")


def load_tools(specs: Sequence[str]) -> list[Tool]:
    """Tools from their config entries: ``python`` (the sandboxed code runner) or an import path."""
    out = []
    for spec in specs:
        if spec == "python":
            from grouprl.envs.python_tool import make_python_tool

            out.append(Tool.of(make_python_tool()))
            continue
        fn = import_object(spec, "tool")
        if not callable(fn):
            raise ConfigError(f"tool {spec!r} is a {type(fn).__name__}, not a callable")
        out.append(Tool.of(fn))
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"two tools share a name: {names}")
    return out


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= RESULT_CHARS else text[:RESULT_CHARS] + f" ... [{len(text) - RESULT_CHARS} more chars]"


def _answer(fn: Callable[..., Any], call: ToolCall) -> tuple[str, bool]:
    """``(message text, failed)`` of one call, in the tool's process: every exception becomes the message."""
    try:
        value = fn(**call.arguments)
        if inspect.iscoroutine(value):
            value = asyncio.run(value)
        return _text(value), False
    except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt from a tool are its errors too
        try:
            return _text(f"error: {call.name} raised {type(e).__name__}: {e}"), True
        except BaseException:  # noqa: BLE001 - an exception whose text cannot be made
            return f"error: {call.name} raised {type(e).__name__}", True


@dataclass
class _Process:
    """One call's process (also its process group's id), its answer pipe's read end, its exit status once reaped."""
    name: str
    pid: int
    fd: int
    status: int | None = None

    def end(self) -> int:
        """Kill what is left of the call's process group, reap its process and close the pipe; the exit status."""
        if self.status is None:
            for kill in (os.killpg, os.kill):
                try:
                    kill(self.pid, signal.SIGKILL)
                    break
                except (ProcessLookupError, PermissionError):
                    continue  # not yet its own group leader (killed as a process), or gone
            self.status = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            os.close(self.fd)
        return self.status


def _fork_call(fn: Callable[..., Any], call: ToolCall) -> _Process:
    """Start ``call`` in a forked process that writes ``{"text", "failed"}`` as JSON to a pipe and exits."""
    read, write = os.pipe()
    try:
        pid = os.fork()
    except BaseException:
        os.close(read)
        os.close(write)
        raise
    if pid == 0:  # the tool's process: never returns into the trainer's code
        status = 0
        try:
            os.close(read)
            os.setsid()  # its own process group, killed whole at the deadline
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            text, failed = _answer(fn, call)
            payload = json.dumps({"text": text, "failed": failed}).encode()
            while payload:
                payload = payload[os.write(write, payload):]
        except BaseException:  # noqa: BLE001 - the parent reports a process that ended without an answer
            status = 70
        finally:
            os._exit(status)
    os.close(write)
    return _Process(call.name, pid, read)


def _collect(process: _Process, deadline: float, timeout_s: float) -> tuple[str, str, bool]:
    """The call's ``(tool name, message text, failed)``, waiting for its process until ``deadline``."""
    chunks: list[bytes] = []
    while True:
        left = max(deadline - time.monotonic(), 0.0)  # past the deadline: only an answer already written counts
        if not select.select([process.fd], [], [], left)[0]:
            process.end()
            return process.name, f"error: {process.name} took longer than {timeout_s:g} s", True
        chunk = os.read(process.fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    code = process.end()
    try:
        answer = json.loads(b"".join(chunks))
        return process.name, str(answer["text"]), bool(answer["failed"])
    except (ValueError, KeyError, TypeError):
        return process.name, f"error: {process.name} ended without an answer (exit status {code})", True


class PendingCalls:
    """Tool calls started by :meth:`ToolRunner.start`; :meth:`results` waits for them."""

    def __init__(self, out: list[tuple[str, str, bool] | None], running: dict[int, _Process], deadline: float,
                 timeout_s: float):
        self.out, self.running, self.deadline, self.timeout_s = out, running, deadline, timeout_s

    def results(self) -> list[tuple[str, str, bool]]:
        """``(tool name, message text, failed)`` for each call, in order, waiting at most until their deadline."""
        try:
            for i in list(self.running):
                self.out[i] = _collect(self.running[i], self.deadline, self.timeout_s)
                del self.running[i]
        finally:  # an interrupted wait leaves no process behind
            self.cancel()
        return self.out  # type: ignore[return-value]

    def cancel(self) -> None:
        for process in self.running.values():
            process.end()
        self.running = {}


class ToolRunner:
    """Executes tool calls against ``tools`` with a per-call timeout."""

    def __init__(self, tools: Sequence[Tool], timeout_s: float):
        self.tools = {t.name: t for t in tools}
        self.timeout_s = timeout_s

    def run(self, calls: Sequence[ToolCall]) -> list[tuple[str, str, bool]]:
        """``(tool name, message text, failed)`` for each call, in order."""
        return self.start(calls).results()

    def start(self, calls: Sequence[ToolCall]) -> PendingCalls:
        """Start every call that can run, each in its own process, all against one deadline."""
        out: list[tuple[str, str, bool] | None] = [None] * len(calls)
        running: dict[int, _Process] = {}
        deadline = time.monotonic() + self.timeout_s
        try:
            for i, call in enumerate(calls):
                problem = self._problem(call)
                if problem is not None:
                    out[i] = ((call.name or "error")[:NAME_CHARS], problem, True)
                    continue
                try:
                    running[i] = _fork_call(self.tools[call.name].fn, call)
                except OSError as e:  # no process could be made (out of memory or processes): the call fails
                    out[i] = (call.name, f"error: {call.name} could not be started: {e}", True)
        except BaseException:
            PendingCalls([], running, deadline, self.timeout_s).results()
            raise
        return PendingCalls(out, running, deadline, self.timeout_s)

    def _problem(self, call: ToolCall) -> str | None:
        if call.error is not None:
            return f"error: {call.error}"
        if call.name not in self.tools:
            known = ", ".join(self.tools) or "none"
            return f"error: there is no tool {call.name!r:.{NAME_CHARS}}; the tools are: {known}"
        try:
            inspect.signature(self.tools[call.name].fn).bind(**call.arguments)
        except TypeError as e:
            return f"error: bad arguments for {call.name}: {e}"
        return None
