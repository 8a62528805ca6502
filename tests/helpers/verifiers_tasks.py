"""verifiers tasksets for the adapter's tests: digit answers scored by weighted rewards, a tool, and tasksets
that need what only verifiers' harness provides."""

from __future__ import annotations

import verifiers.v1 as vf


class DigitData(vf.TaskData):
    target: str = ""


class DigitTask(vf.Task[DigitData]):
    @vf.reward
    async def digits(self, trace) -> float:
        """The share of digits in the answer."""
        reply = trace.last_reply
        return sum(ch.isdigit() for ch in reply) / max(len(reply), 1)

    @vf.reward(weight=0.5)
    async def exact(self, task, trace) -> float:
        return float(trace.last_reply == task.target)


class Counter(vf.Toolset):
    @vf.tool
    async def count(self, text: str) -> int:
        """Count the characters of a text."""
        return len(text)


class DigitTaskset(vf.Taskset[DigitTask]):
    def load(self):
        for i in range(3):
            yield DigitTask(DigitData(prompt=f"Write digits, task {i}.", system_prompt="Be brief.", target=str(i)))

    @classmethod
    def toolsets(cls, config):
        return [Counter(vf.ToolsetConfig())]


def digit_tasks(size: int = 3) -> DigitTaskset:
    """The taskset, cut to ``size`` tasks."""
    return DigitTaskset(vf.TasksetConfig()).take(size)


TASKS = DigitTaskset(vf.TasksetConfig())


class SandboxTask(DigitTask):
    @vf.reward
    async def passed(self, trace, runtime) -> float:
        return 1.0


class SandboxTaskset(vf.Taskset[SandboxTask]):
    def load(self):
        yield SandboxTask(DigitData(prompt="Run the tests."))


def sandboxed() -> SandboxTaskset:
    return SandboxTaskset(vf.TasksetConfig())


class Endless(vf.Taskset[DigitTask]):
    INFINITE = True

    def load(self):
        while True:
            yield DigitTask(DigitData(prompt="again"))


ENDLESS = Endless(vf.TasksetConfig())
