"""SIGTERM (a scheduler's preemption) and SIGINT end a run the same way: a message, the run folder released, and
while training a checkpoint of the last whole step (:class:`StopOnSignal`); a second signal, or
:data:`SIGNAL_GRACE_S` passing, raises :class:`~grouprl.errors.Interrupted` where it is."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from grouprl.errors import Interrupted

SIGNAL_GRACE_S = 25.0
"""Seconds from a stop signal to the run's end: under the 30 s schedulers wait before SIGKILL, with room to exit."""
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum, f"{signal.Signals(signum).name} received")


@contextlib.contextmanager
def interrupts() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`~grouprl.errors.Interrupted` in the main thread while inside."""
    if not _main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise) for s in SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class StopOnSignal:
    """The training loop's side of a stop signal: :attr:`requested` once one came; :meth:`finish` saves and raises."""

    def __init__(self, save: bool, grace_s: float = SIGNAL_GRACE_S):
        self.save, self.grace_s = save, grace_s
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def install(self) -> StopOnSignal:
        if _main_thread():
            self._previous = {s: signal.getsignal(s) for s in (*SIGNALS, signal.SIGALRM)}
            for s in SIGNALS:
                signal.signal(s, self._first)
            signal.signal(signal.SIGALRM, self._too_late)
        return self

    def uninstall(self) -> None:
        if self._previous:
            signal.setitimer(signal.ITIMER_REAL, 0)
            for s, handler in self._previous.items():
                signal.signal(s, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
            self._previous = {}

    def _first(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested:  # a second signal: stop at once
            raise Interrupted(signum, f"{name} received again")
        self.signum = signum
        signal.setitimer(signal.ITIMER_REAL, self.grace_s)
        saving = " and saving a checkpoint" if self.save else ""
        # os.write, not print: a handler may run inside another write to the same stream
        os.write(2, f"grouprl: {name}: stopping after this step{saving} (within {self.grace_s:g} s; send it again "
                    "to stop at once)\n".encode())

    def _too_late(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(self.signum or signal.SIGTERM).name
        raise Interrupted(self.signum or signal.SIGTERM,
                          f"{name}: the step (or its checkpoint) did not end within {self.grace_s:g} s")

    def finish(self, signalled: bool, save: Callable[[], Any], step: int,
               echo: Callable[[str], None] | None) -> None:
        """When any process got a signal: save a checkpoint of ``step`` (if any) and raise ``Interrupted``."""
        if not signalled:
            return
        signum = self.signum or signal.SIGTERM
        name = signal.Signals(signum).name
        if self.save and step > 0:
            started = time.perf_counter()
            folder = save()
            if echo is not None:
                echo(f"grouprl: {name}: saved {folder} ({time.perf_counter() - started:.1f} s)")
        raise Interrupted(signum, f"{name} received")
