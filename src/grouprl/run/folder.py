"""A run folder: a run claims it with a lock file before any expensive work (a dead process's lock is taken over); a
folder holding a run is refused unless resumed or replaced with ``overwrite``, which removes only what runs
write; a folder holding anything else is refused; a start that never finished a step is replaced."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from grouprl.errors import ConfigError
from grouprl.run.loggers import run_folders
from grouprl.run.signals import interrupts

RUN_FILES = ("metrics.jsonl", "completions.jsonl", "summary.json", "config.yaml", "timeline.jsonl")
RUN_DIRS = ("checkpoints", "report", "servers", *run_folders())
LOCK = ".grouprl.lock"
# the atomic writer's temporary files a kill left
OWN_TEMP = re.compile(r"^\.(metrics\.jsonl|completions\.jsonl|summary\.json|config\.yaml|timeline\.jsonl)\..*\.tmp$")
CHECKPOINT_NAME = re.compile(r"^(step-\d+|\.tmp-step-.*|\.delete-step-.*)$")
REPORT_NAME = re.compile(r"^(report\.html|[a-z_]+\.png|\.[a-z_]+\.(html|png)\..*\.tmp)$")
SERVER_LOG_NAME = re.compile(r"^server-\d+\.log$")
OWN_NAMES = {"checkpoints": CHECKPOINT_NAME, "report": REPORT_NAME, "servers": SERVER_LOG_NAME}
"""What a run writes inside its folders whose other contents are checked."""


def holds_run(folder: str | Path) -> bool:
    """Whether ``folder`` holds an earlier run that finished at least one training step."""
    out = Path(folder)
    if (out / "checkpoints").is_dir() and any(CHECKPOINT_NAME.match(p.name) for p in (out / "checkpoints").iterdir()):
        return True
    log = out / "metrics.jsonl"
    if not log.exists():
        return False
    for line in log.read_text(encoding="utf-8", errors="replace").split("\n"):  # not splitlines: see JsonlLog
        try:
            if int(json.loads(line).get("step", 0)) > 0:
                return True
        except (ValueError, TypeError, AttributeError):
            continue  # a torn line of a killed writer
    return False


RUN_CONFIG_HEADER = "# The resolved config of a grouprl run: grouprl train --config <this file> repeats it.\n"
"""A config.yaml without this first line, in a folder that holds no run, is a user's file and is never replaced."""


def _users_config(out: Path) -> bool:
    config = out / "config.yaml"
    if not config.is_file() or holds_run(out):
        return False
    with open(config, encoding="utf-8", errors="replace") as f:
        return f.readline() != RUN_CONFIG_HEADER


def foreign_entries(folder: str | Path) -> list[str]:
    """What in ``folder`` no run writes (paths relative to it)."""
    out = Path(folder)
    if not out.is_dir():
        return []
    found = ["config.yaml"] if _users_config(out) else []
    for p in sorted(out.iterdir()):
        if p.name in RUN_FILES + (LOCK, *run_folders()) or OWN_TEMP.match(p.name):
            continue
        if p.name in OWN_NAMES and p.is_dir():
            found += [f"{p.name}/{q.name}" for q in sorted(p.iterdir()) if not OWN_NAMES[p.name].match(q.name)]
            continue
        found.append(p.name)
    return found


class FolderLock:
    """``folder/.grouprl.lock``: the process that holds the folder (pid and host, as JSON)."""

    def __init__(self, folder: Path):
        self.path = folder / LOCK
        self.held = False

    def acquire(self, echo: Callable[[str], None]) -> FolderLock:
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": _started(os.getpid())}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder is not None and _alive(holder):
                    raise ConfigError(
                        f"output_dir {str(self.path.parent)!r} is in use by process {holder['pid']} on "
                        f"{holder['host']}; wait for it, or choose another --output_dir") from None
                echo(f"{self.path} was left by a process that is gone; taking the folder over")
                self.path.unlink(missing_ok=True)
                continue
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(me, f)
            except OSError as e:  # a full disk: no lock left behind, and the reason said
                self.path.unlink(missing_ok=True)
                free = shutil.disk_usage(self.path.parent).free
                raise ConfigError(f"could not claim {str(self.path.parent)!r}: writing {self.path.name} failed "
                                  f"({e.strerror or e}; {free / 2**20:.1f} MiB free on its disk)") from e
            self.held = True
            return self
        raise ConfigError(f"could not claim {self.path.parent}: another run keeps claiming it")

    def _holder(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None  # half-written by a process killed as it claimed the folder

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _started(pid: int) -> int | None:
    """When process ``pid`` started (/proc/<pid>/stat field 22), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive(holder: dict) -> bool:
    """Whether the lock's process still runs (by pid and start time); a lock from another host is trusted."""
    if holder.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        pass
    started = holder.get("started")
    return started is None or _started(int(holder["pid"])) in (None, started)


def remove_run_files(folder: Path) -> None:
    for name in RUN_FILES:
        (folder / name).unlink(missing_ok=True)
    for p in folder.iterdir():
        if OWN_TEMP.match(p.name):
            p.unlink(missing_ok=True)
    for name in RUN_DIRS:
        shutil.rmtree(folder / name, ignore_errors=True)


def claim_output_dir(folder: str | Path, *, resume_from: str | None = None, overwrite: bool = False,
                     echo: Callable[[str], None] = print) -> tuple[FolderLock, bool]:
    """Claim ``folder`` by the rules of the module docstring; returns (the lock, whether a resume is possible)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    lock = FolderLock(out).acquire(echo)
    try:
        foreign = foreign_entries(out)
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise ConfigError(f"output_dir {str(out)!r} holds files that are not a run's ({shown}); a run would "
                              "mix into them and --overwrite would not remove them. Choose another --output_dir")
        for stale in out.iterdir():  # a run's temporary files left by a kill: never anyone else's
            if OWN_TEMP.match(stale.name):
                stale.unlink(missing_ok=True)
        earlier = holds_run(out)
        if earlier and not resume_from and not overwrite:
            raise ConfigError(f"output_dir {str(out)!r} already holds a run; continue it with --resume_from latest, "
                              "replace it with --overwrite, or choose another --output_dir")
        if earlier and overwrite and not resume_from:
            echo(f"replacing the earlier run in {out}")
            remove_run_files(out)
        elif not earlier and any((out / name).exists() for name in RUN_FILES + RUN_DIRS):
            echo(f"{out} holds an earlier start that never trained a step; starting afresh")
            remove_run_files(out)
    except BaseException:
        lock.release()
        raise
    return lock, earlier


CLAIMED_BY_PARENT = "GROUPRL_CLAIMED_OUTPUT_DIR"  # set for the processes of --nproc


@contextlib.contextmanager
def claimed(config: Any, *, overwrite: bool = False, echo: Callable[[str], None] = print,
            claim: bool = True) -> Iterator[Any]:
    """``config`` with its ``output_dir`` claimed for the duration (``claim`` False: a parent or first rank
    holds it); ``resume_from: latest`` with nothing to resume starts afresh; signals raise ``Interrupted``."""
    folder = Path(config.output_dir)
    with interrupts():  # SIGTERM, like SIGINT, unwinds through here: the lock is released on the way out
        if not claim or os.environ.get(CLAIMED_BY_PARENT) == str(folder.resolve()):
            yield config
            return
        created = not folder.exists()
        lock, resumable = claim_output_dir(folder, resume_from=config.resume_from, overwrite=overwrite, echo=echo)
        try:
            if config.resume_from == "latest" and not resumable:
                echo(f"nothing to resume in {folder} (no training step was saved); starting afresh")
                config = dataclasses.replace(config, resume_from=None)
            yield config
        finally:
            lock.release()
            if created and not any(folder.iterdir()):  # a start refused before writing leaves nothing behind
                folder.rmdir()
