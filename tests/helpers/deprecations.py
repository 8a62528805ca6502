"""Deprecated calls of grouprl's own into a library, found while they run.

A library announces a deprecation (FutureWarning or DeprecationWarning) from inside itself: ``transformers``
warns from the deprecated method or from its keyword-renaming decorator, reached through ``torch``'s module
call, so the warning's file is theirs, never the caller's, and a warning filter by module cannot tell whose
call it was. :func:`deprecated_calls` looks at the stack when the warning is shown instead. The caller of the
function that warns, and the frame the warning names (its ``stacklevel``), each taken past the call plumbing
between (:data:`PASS_THROUGH`), are the candidates: when one is grouprl's code, the call is ours to change. A
deprecation that a library sets off inside its own calls (transformers into torch, or into itself), or during
an import, is not.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from types import FrameType

OURS = "grouprl"
"""The package whose deprecated calls are reported."""
PASS_THROUGH = frozenset({"warnings", "functools", "contextlib", "torch.nn.modules.module", "torch.utils._contextlib"})
"""Modules whose frames only pass a call on (a module's ``__call__``, decorators, context managers)."""
CATEGORIES = (DeprecationWarning, FutureWarning)


def _module(frame: FrameType) -> str:
    return str(frame.f_globals.get("__name__", ""))


def _package(frame: FrameType) -> str:
    return _module(frame).split(".")[0]


def _past_plumbing(frame: FrameType | None) -> FrameType | None:
    while frame is not None and _module(frame) in PASS_THROUGH:
        frame = frame.f_back
    return frame


def our_caller(frame: FrameType | None, filename: str = "", lineno: int = 0) -> str | None:
    """``file:line`` of grouprl's call that made the warning being shown from ``frame`` (the frame of the
    ``showwarning`` hook, or any frame inside the warning machinery), or None when the warning is grouprl's
    own or the deprecated call was someone else's. ``filename`` and ``lineno`` are where the warning says
    it comes from."""
    emitter = _past_plumbing(frame)
    if emitter is None or _package(emitter) == OURS:
        return None  # a warning of our own: pyproject.toml's filters turn our deprecations into errors
    named = emitter
    while named is not None and (named.f_code.co_filename, named.f_lineno) != (filename, lineno):
        named = named.f_back
    for candidate in (_past_plumbing(emitter.f_back), _past_plumbing(named)):
        if candidate is not None and _package(candidate) == OURS:
            return f"{candidate.f_code.co_filename}:{candidate.f_lineno}"
    return None


@contextlib.contextmanager
def deprecated_calls() -> Iterator[list[str]]:
    """Within the block, every deprecation shown whose caller is grouprl is added to the yielded list as
    ``file:line: Category: message``; each warning still goes on to wherever it went before (pytest's
    record of the test's warnings, or stderr). Warnings that the filters ignore or turn into errors are
    never shown, so never seen here."""
    found: list[str] = []
    previous = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001 (warnings' signature)
        caller = our_caller(sys._getframe(1), filename, lineno) if issubclass(category, CATEGORIES) else None
        if caller is not None:
            found.append(f"{caller}: {category.__name__}: {message}")
        if previous is getattr(warnings, "_showwarning_orig", None) and hasattr(warnings, "_showwarnmsg_impl"):
            # the default hook: pass the warning to the implementation it calls, which catch_warnings(record=True)
            # (pytest's record of a test's warnings) replaces
            warnings._showwarnmsg_impl(warnings.WarningMessage(message, category, filename, lineno, file, line))
        else:
            previous(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield found
    finally:
        warnings.showwarning = previous
