"""Native kernels of the rollout engine: C++ sources next to this file, compiled with the system's C++
compiler on first use (about a second) and kept in the user cache folder, keyed by the source, the flags and
the compiler, so that an edit or another compiler builds anew. The build is written under a temporary name
and renamed into place: processes that start together each build, and the last rename wins with an
identical file.

The kernels are x86 AVX2 + FMA code (every x86-64 CPU of the last decade: AMD Zen, Intel Haswell and
later) and are loaded with ``ctypes``: a call releases the GIL, and OpenMP's runtime is the one PyTorch
already loaded (the same ``libgomp.so.1``), so threads are shared, not doubled.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path

FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
CPU_FLAGS = ("avx2", "fma")
"""What the kernels' instructions need from the CPU (``/proc/cpuinfo``'s names)."""


class KernelUnavailable(RuntimeError):
    """A native kernel cannot run here; the message says why (the CPU, the compiler, the build)."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "grouprl" / "kernels"


def _cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return set(value.split())
    except OSError:
        pass
    return set()


def cpu_problem(machine: str | None = None, flags: set[str] | None = None) -> str | None:
    """Why this CPU cannot run the kernels, or None where it can."""
    machine = (machine or platform.machine()).lower()
    if machine not in ("x86_64", "amd64"):
        return f"the native kernels are x86 AVX2 code; this machine is {machine}"
    flags = _cpu_flags() if flags is None else flags
    missing = [f for f in CPU_FLAGS if f not in flags]
    if missing:
        return f"the native kernels need a CPU with {' and '.join(CPU_FLAGS)}; this one lacks {', '.join(missing)}"
    return None


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


_LOADED: dict[str, ctypes.CDLL | KernelUnavailable] = {}


def load(name: str) -> ctypes.CDLL:
    """The library built from ``<name>.cpp`` beside this file (built now if the cache has no build of this
    source); raises :class:`KernelUnavailable` saying why where it cannot be built or run (once per process:
    the answer is kept)."""
    if name not in _LOADED:
        try:
            _LOADED[name] = _build(name)
        except KernelUnavailable as e:
            _LOADED[name] = e
    found = _LOADED[name]
    if isinstance(found, KernelUnavailable):
        raise found
    return found


def _build(name: str) -> ctypes.CDLL:
    problem = cpu_problem()
    if problem:
        raise KernelUnavailable(problem)
    cxx = compiler()
    if cxx is None:
        raise KernelUnavailable("no C++ compiler found (set CXX, or install g++ or clang++)")
    source = Path(__file__).with_name(f"{name}.cpp")
    digest = hashlib.sha1(b"\0".join([source.read_bytes(), " ".join(FLAGS).encode(), cxx.encode()])).hexdigest()
    target = cache_dir() / f"{name}-{digest[:16]}.so"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            done = subprocess.run([cxx, *FLAGS, str(source), "-o", str(tmp)], capture_output=True, text=True,
                                  timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise KernelUnavailable(f"building {source.name} with {cxx} failed: {e}") from e
        if done.returncode != 0:
            tmp.unlink(missing_ok=True)
            detail = (done.stderr or done.stdout).strip().splitlines()[:5]
            raise KernelUnavailable(f"building {source.name} with {cxx} failed:\n" + "\n".join(detail))
        os.replace(tmp, target)
    try:
        return ctypes.CDLL(str(target))
    except OSError as e:
        raise KernelUnavailable(f"loading {target} failed: {e}") from e
