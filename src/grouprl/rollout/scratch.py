"""Temporary folders that go with their process, however it ends: ``atexit`` misses a SIGKILL, so a watcher process
blocks reading a pipe whose only writer is the owner, and removes the folder when the kernel closes it."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path

WATCHER_EXIT_S = 5.0

_WATCH = ("import os, shutil, sys; os.chdir('/'); sys.stdin.buffer.read(); "
          "shutil.rmtree(sys.argv[1], ignore_errors=True)")


class ScratchFolder:
    """A new empty folder ``<parent>/<prefix>XXXXXXXX``, removed by :meth:`remove`, collection, exit or its watcher."""

    def __init__(self, prefix: str, parent: str | Path | None = None):
        self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        try:
            # -I -S: no site packages to import, so the watcher is up in tens of milliseconds
            self._watcher = subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCH, str(self.path)],
                                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            shutil.rmtree(self.path, ignore_errors=True)
            raise
        self._finalizer = weakref.finalize(self, _remove, self.path, self._watcher)

    def remove(self) -> None:
        self._finalizer()

    @property
    def removed(self) -> bool:
        return not self._finalizer.alive

    def __repr__(self) -> str:
        return f"ScratchFolder({str(self.path)!r}{', removed' if self.removed else ''})"


def _remove(path: Path, watcher: subprocess.Popen) -> None:
    shutil.rmtree(path, ignore_errors=True)
    if watcher.stdin is not None:
        watcher.stdin.close()  # the watcher wakes, finds nothing to remove and exits
    with contextlib.suppress(subprocess.TimeoutExpired):  # a fork of this process holds the pipe: the watcher
        watcher.wait(timeout=WATCHER_EXIT_S)              # waits for that fork too
