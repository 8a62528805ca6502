"""The process's memory allocator: tcmalloc and jemalloc reuse freed pages across a step's changing tensor shapes
(docs/performance.md). One can only be loaded first, through ``LD_PRELOAD``, so the ``grouprl`` command starts
itself again once with it (:func:`preload_environ`)."""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from grouprl.errors import ConfigError
from grouprl.registry import Registry

ALLOCATORS: Registry[tuple[str, ...]] = Registry("allocator")  # name -> the library files that provide it, best first
ALLOCATORS.register("tcmalloc", ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"))
ALLOCATORS.register("jemalloc", ("libjemalloc.so.2",))
PREFERENCE = ("tcmalloc", "jemalloc")  # the order auto tries: tcmalloc gave the faster steps
PRELOADED = "GROUPRL_ALLOCATOR_PRELOADED"  # set in a restarted process: it is never started a third time
INSTALL_HINT = "apt-get install libtcmalloc-minimal4 (Debian, Ubuntu) or dnf install gperftools-libs (Fedora)"


class Allocator(NamedTuple):
    name: str
    path: Path


def library_dirs() -> list[Path]:
    """Where shared libraries are looked for: this environment's lib folder first, then the system's."""
    arch = sysconfig.get_config_var("MULTIARCH") or ""
    candidates = [Path(sys.prefix) / "lib", Path(sys.base_prefix) / "lib", Path("/usr/local/lib"),
                  Path("/usr/lib") / arch, Path("/lib") / arch, Path("/usr/lib64"), Path("/usr/lib")]
    return list(dict.fromkeys(candidates))  # each once, in order


def find(name: str, dirs: Sequence[Path] | None = None) -> Allocator | None:
    for d in library_dirs() if dirs is None else dirs:
        for file in ALLOCATORS.get(name):
            if (Path(d) / file).is_file():
                return Allocator(name, Path(d) / file)
    return None


def resolve(setting: str, dirs: Sequence[Path] | None = None) -> Allocator | None:
    """The allocator the ``allocator`` setting asks for (None: malloc); a missing one is a ConfigError."""
    if setting == "system":
        return None
    if setting == "auto":
        return next((a for a in (find(n, dirs) for n in PREFERENCE) if a is not None), None)
    if "/" in setting:
        path = Path(setting).expanduser()
        if not path.is_file():
            raise ConfigError(f"allocator: {setting!r} is not a file; give a shared library such as "
                              "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4, or auto or system")
        return Allocator(allocator_name(path) or path.name, path)
    try:
        files = ALLOCATORS.get(setting)
    except ValueError as e:  # the registry's message: the closest names and the valid ones
        raise ConfigError(f"allocator: {e}, or auto, system or a library's path") from None
    found = find(setting, dirs)
    if found is None:
        looked = ", ".join(str(d) for d in (library_dirs() if dirs is None else dirs))
        raise ConfigError(f"allocator: {setting} is not installed ({', '.join(files)} not found in "
                          f"{looked}); install it ({INSTALL_HINT}) or set allocator: auto or system")
    return found


def allocator_name(path: Path) -> str | None:
    """The registered allocator a library file provides, by its file name."""
    return next((n for n in ALLOCATORS.names() if any(path.name.startswith(f.split(".so")[0] + ".so")
                                                      for f in ALLOCATORS.get(n))), None)


def running(maps: str | os.PathLike = "/proc/self/maps") -> Allocator | None:
    try:
        text = Path(maps).read_text(encoding="utf-8", errors="replace")
    except OSError:  # not Linux: nothing to read, nothing claimed
        return None
    for line in text.splitlines():
        fields = line.split(maxsplit=5)  # address, permissions, offset, device, inode, path
        if len(fields) == 6 and fields[5].startswith("/"):
            path = Path(fields[5].strip())
            name = allocator_name(path)
            if name is not None:
                return Allocator(name, path)
    return None


def preload_environ(setting: str, environ: Mapping[str, str], dirs: Sequence[Path] | None = None,
                    maps: str | os.PathLike = "/proc/self/maps") -> dict[str, str] | None:
    """The environment to start this command again with the allocator in ``LD_PRELOAD``, or None."""
    if environ.get(PRELOADED) or running(maps) is not None:
        return None
    chosen = resolve(setting, dirs)
    if chosen is None:
        return None
    rest = environ.get("LD_PRELOAD", "")
    return {**environ, "LD_PRELOAD": f"{chosen.path} {rest}".strip(), PRELOADED: chosen.name}


def restart_with_allocator(setting: str, command: Sequence[str]) -> None:
    """Replace this process with ``command`` started under the allocator ``setting`` picks (see
    :func:`preload_environ`); return without doing anything when it picks none."""
    env = preload_environ(setting, os.environ)
    if env is None or not command or not command[0]:  # an embedded interpreter has no executable to start
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], list(command), env)


def restart_command(setting: str, is_program: bool) -> None:
    """Start this ``grouprl`` command again, once, under the allocator ``setting`` picks; only when
    ``is_program``: a process whose ``main`` was called from Python is not the command's to replace."""
    if is_program:
        restart_with_allocator(setting, [sys.executable, "-m", "grouprl", *sys.argv[1:]])


def describe(dirs: Sequence[Path] | None = None, maps: str | os.PathLike = "/proc/self/maps") -> str:
    """The allocator running, for the run's setup (with malloc: where a faster one is, or how to get one)."""
    now = running(maps)
    if now is not None:
        return f"{now.name} ({now.path})"
    found = resolve("auto", dirs)
    if found is None:
        return f"the C library's malloc (tcmalloc lowers the peak and speeds steps up: {INSTALL_HINT})"
    return (f"the C library's malloc ({found.name} is installed: the grouprl command preloads it unless allocator is "
            f"system; a script can start with LD_PRELOAD={found.path})")
