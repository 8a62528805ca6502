"""The built-in ``python`` tool: the policy's code run in the code reward's sandbox
(:class:`grouprl.rewards.sandbox.Sandbox`), its output handed back as the tool's result."""

from __future__ import annotations

from collections.abc import Callable

from grouprl.rewards.sandbox import Sandbox, SandboxLimits

OUTPUT_CHARS = 1500


def make_python_tool(timeout_s: float = 5.0, memory_mb: int = 512) -> Callable[[str], str]:
    """A ``python(code)`` tool running each program in a fresh sandbox with these limits."""
    sandbox = Sandbox(SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb))

    def python(code: str) -> str:
        """Run a Python program and return what it printed.

        Args:
            code: the program's source; print what you want to see.
        """
        result = sandbox.run(code)
        if result.timed_out:
            return f"error: the program ran longer than {timeout_s:g} s and was stopped"
        out = result.stdout[-OUTPUT_CHARS:]
        if result.returncode != 0:
            return (out + "\n" if out else "") + "error: " + result.stderr.strip()[-OUTPUT_CHARS:]
        return out or "(no output)"

    return python
