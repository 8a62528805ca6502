"""Tools the policy may call: plain Python callables described by their type hints and docstring.

A tool is any function with type hints and a Google-style docstring (``Args:`` naming each
argument); its JSON schema comes from ``transformers.utils.get_json_schema``, the form chat templates
take as ``tools=``. A template that ignores ``tools=`` (SmolLM2's does) gets the tools described in
the system message by :func:`tools_system_prompt`, in the Hermes format below.

Calls are read from an assistant turn by a parser of :data:`TOOL_PARSERS` (default ``hermes``)::

    <tool_call>{"name": "calculator", "arguments": {"expression": "23 * 47"}}</tool_call>

Every call is answered with one ``tool`` message, never an exception: a result (turned to text), or
an error the model can read (malformed JSON, an unknown tool, bad arguments, a tool that raised, a
call that ran past ``timeout_s``). Calls of one turn run concurrently: async tools on one event loop,
the others on threads. A thread cannot be killed, so a synchronous tool that never returns keeps its
thread after the timeout answered for it: run untrusted work in the ``python`` tool, whose sandbox
kills its process.
"""

from __future__ import annotations

import ast
import asyncio
import concurrent.futures
import inspect
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from grouprl.errors import ConfigError
from grouprl.registry import Registry, import_object

RESULT_CHARS = 2000
"""A tool result longer than this is cut (the model's context is small; say so in the message)."""


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
    """One call read from an assistant turn, or the reason it could not be read."""

    name: str | None
    arguments: dict[str, Any]
    error: str | None = None


ToolParser = Callable[[str], list[ToolCall]]
TOOL_PARSERS: Registry[ToolParser] = Registry("tool parser")
"""name -> ``fn(assistant text) -> calls`` (empty when the turn calls no tool)."""

HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def parse_hermes(text: str) -> list[ToolCall]:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (an unclosed last one too:
    the turn may stop right after the JSON; a Python dict literal is read like JSON).

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
            except json.JSONDecodeError:
                args = None
        if not isinstance(args, dict):
            calls.append(ToolCall(data["name"], {}, "the tool call's arguments must be a JSON object"))
            continue
        calls.append(ToolCall(data["name"], args))
    return calls


def _json_or_literal(text: str) -> Any:
    """``text`` as JSON, else as a Python literal (small models often write ``{'name': ...}``); None
    when it is neither. ``ast.literal_eval`` builds only literals: no code runs.

    >>> _json_or_literal("{'a': [1, 2]}"), _json_or_literal("{1: f()}")
    ({'a': [1, 2]}, None)
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    if len(text) > 10_000:  # literal_eval's parser is recursive: a deeply nested input could exhaust the stack
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


TOOL_PARSERS.register("hermes", parse_hermes)


def resolve_tool_parser(spec: str) -> ToolParser:
    """The parser ``spec`` names: a name of :data:`TOOL_PARSERS` or the import path of a function
    ``(assistant text) -> list[ToolCall]`` (``module:function``, ``file.py:function``)."""
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


class ToolRunner:
    """Executes a turn's tool calls against ``tools`` with a per-call timeout (see the module docstring)."""

    def __init__(self, tools: Sequence[Tool], timeout_s: float):
        self.tools = {t.name: t for t in tools}
        self.timeout_s = timeout_s

    def run(self, calls: Sequence[ToolCall]) -> list[tuple[str, str, bool]]:
        """``(tool name, message text, failed)`` for each call, in order."""
        out: list[tuple[str, str, bool] | None] = [None] * len(calls)
        pending_sync, pending_async = [], []
        for i, call in enumerate(calls):
            problem = self._problem(call)
            if problem is not None:
                out[i] = (call.name or "error", problem, True)
            elif inspect.iscoroutinefunction(self.tools[call.name].fn):
                pending_async.append(i)
            else:
                pending_sync.append(i)
        if pending_async:
            for i, result in zip(pending_async, asyncio.run(self._run_async([calls[i] for i in pending_async]))):
                out[i] = result
        if pending_sync:
            pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(pending_sync))
            futures = {i: pool.submit(self._call, calls[i]) for i in pending_sync}
            for i, future in futures.items():
                try:
                    out[i] = future.result(timeout=self.timeout_s)
                except concurrent.futures.TimeoutError:
                    out[i] = (calls[i].name, f"error: {calls[i].name} took longer than {self.timeout_s:g} s", True)
            pool.shutdown(wait=False, cancel_futures=True)
        return out  # type: ignore[return-value]

    def _problem(self, call: ToolCall) -> str | None:
        if call.error is not None:
            return f"error: {call.error}"
        if call.name not in self.tools:
            return f"error: there is no tool {call.name!r}; the tools are: {', '.join(self.tools) or 'none'}"
        try:
            inspect.signature(self.tools[call.name].fn).bind(**call.arguments)
        except TypeError as e:
            return f"error: bad arguments for {call.name}: {e}"
        return None

    def _call(self, call: ToolCall) -> tuple[str, str, bool]:
        try:
            return call.name, _text(self.tools[call.name].fn(**call.arguments)), False
        except Exception as e:  # noqa: BLE001 - the model reads the error and goes on
            return call.name, f"error: {call.name} raised {type(e).__name__}: {e}", True

    async def _run_async(self, calls: Sequence[ToolCall]) -> list[tuple[str, str, bool]]:
        async def one(call: ToolCall) -> tuple[str, str, bool]:
            try:
                value = await asyncio.wait_for(self.tools[call.name].fn(**call.arguments), self.timeout_s)
                return call.name, _text(value), False
            except TimeoutError:
                return call.name, f"error: {call.name} took longer than {self.timeout_s:g} s", True
            except Exception as e:  # noqa: BLE001 - the model reads the error and goes on
                return call.name, f"error: {call.name} raised {type(e).__name__}: {e}", True

        return list(await asyncio.gather(*(one(c) for c in calls)))
