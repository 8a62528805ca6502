"""verifiers tasksets (the ``verifiers.v1`` API) in the text-environment protocol, run in process without its
harness: ``verifiers:module:attr`` names a ``Taskset`` or a function of ``env_options`` returning one. A reset
opens the task ``seed % len(tasks)``; the tools are the ``@vf.tool`` methods of its toolsets, run by grouprl's
tool runner; the first turn without a tool call is the answer, scored by the task's ``@vf.reward`` functions.
What needs the harness is refused on loading: rewards that take a ``runtime``, judges, per-task toolset state.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Sequence
from typing import Any

from grouprl.envs.base import Message
from grouprl.envs.tools import Tool
from grouprl.errors import ConfigError
from grouprl.registry import import_object


class VerifiersEnv:
    def __init__(self, tasks: Sequence[Any], tools: Sequence[Tool]):
        self.tasks, self.tools = tasks, list(tools)
        self.task: Any = None
        self.opening: list[Any] = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[list[Message], dict[str, Any]]:
        import verifiers.v1 as vf
        from verifiers.v1.types import content_text

        self.task = self.tasks[(seed or 0) % len(self.tasks)]
        data = self.task.data
        prompt = [vf.UserMessage(content=data.prompt)] if isinstance(data.prompt, str) else list(data.prompt or [])
        if not prompt:
            raise ValueError(f"task {data.idx} has no prompt (verifiers' user simulation is not run here)")
        system = [vf.SystemMessage(content=data.system_prompt)] if data.system_prompt else []
        self.opening = system + prompt
        return [{"role": m.role, "content": content_text(m.content)} for m in self.opening], {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        import verifiers.v1 as vf  # the answer ends the trajectory: its reward is the task's score
        from verifiers.v1.graph import MessageNode
        from verifiers.v1.trace import AgentInfo, TraceTask

        messages = [*self.opening, vf.AssistantMessage(content=action)]
        nodes = [MessageNode(parent=i - 1 if i else None, message=m, sampled=i == len(messages) - 1)
                 for i, m in enumerate(messages)]
        task = self.task
        trace = vf.Trace(task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                         agent=AgentInfo(config=vf.AgentConfig()), nodes=nodes)
        asyncio.run(task.score(trace))
        return "", trace.reward, True, False, {}


class TasksetEnvs:
    """The factory ``(**env_options) -> VerifiersEnv`` of ``module:attr``, loading the taskset once."""

    def __init__(self, path: str):
        self.path, self.spec = path, f"verifiers:{path}"
        self.loaded: tuple[dict[str, Any], list[Any], list[Tool]] | None = None

    def __call__(self, **options: Any) -> VerifiersEnv:
        if self.loaded is None or self.loaded[0] != options:
            self.loaded = (options, *self._load(options))
        return VerifiersEnv(self.loaded[1], self.loaded[2])

    def _load(self, options: dict[str, Any]) -> tuple[list[Any], list[Tool]]:
        import verifiers.v1 as vf

        made = import_object(self.path, "env")
        if isinstance(made, vf.Taskset) and options:
            raise ConfigError(f"env {self.spec!r} is a Taskset: env_options {options} go to a function returning one")
        taskset = made if isinstance(made, vf.Taskset) else made(**options) if callable(made) else made
        if not isinstance(taskset, vf.Taskset):
            raise ConfigError(f"env {self.spec!r} gives a {type(taskset).__name__}, not a verifiers.v1 Taskset")
        if not taskset.bounded:
            raise ConfigError(f"env {self.spec!r} is an infinite taskset: bound it, e.g. taskset.take(1000)")
        tasks = list(taskset)
        if not tasks:
            raise ConfigError(f"env {self.spec!r}: its taskset has no tasks")
        for task in {type(t): t for t in tasks}.values():
            self._check(task)
        toolsets = [*type(taskset).toolsets(taskset.config),
                    *(ts for t in {type(t): t for t in tasks}.values() for ts in type(t).toolsets(t.config))]
        return tasks, [tool for ts in toolsets for tool in self._tools(ts)]

    def _check(self, task: Any) -> None:
        needs = [fn.__name__ for fn in task.hooks("reward")
                 if "runtime" in (params := inspect.signature(fn).parameters)
                 and params["runtime"].default is inspect.Parameter.empty]
        if needs:
            raise ConfigError(f"env {self.spec!r}: rewards {needs} of {type(task).__name__} read a runtime (a sandbox "
                              "verifiers' harness provisions); only rewards over the task and trace run here")
        if task.config.judges:
            raise ConfigError(f"env {self.spec!r}: {type(task).__name__} has judges, which call a model through "
                              "verifiers' harness: score with reward_functions or judge instead")

    def _tools(self, toolset: Any) -> list[Tool]:
        """A toolset's ``@vf.tool`` methods with their MCP schemas, after its ``setup()``."""
        from mcp.server.mcpserver import MCPServer
        from pydantic import validate_call
        from verifiers.v1.mcp.server import ServerBase
        from verifiers.v1.utils.decorators import discover_decorated

        if type(toolset).setup_task is not ServerBase.setup_task:
            raise ConfigError(f"env {self.spec!r}: toolset {type(toolset).__name__} keeps per-task state "
                              "(setup_task), which needs verifiers' harness")
        asyncio.run(toolset.setup())
        server = MCPServer(type(toolset).__name__)
        toolset.register(server)
        fns = {getattr(fn, "tool_name", None) or fn.__name__: fn for fn in discover_decorated(toolset, "tool")}
        # arguments are checked against the signature as the MCP server would, so a wrong type is the tool's error
        return [Tool(validate_call(fns[t.name]), {"type": "function", "function": {
            "name": t.name, "description": t.description or "", "parameters": t.input_schema}})
            for t in asyncio.run(server.list_tools())]
