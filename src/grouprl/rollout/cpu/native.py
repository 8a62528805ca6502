"""Native x86 AVX2 + FMA kernels: C++ sources beside this file, built on first use; where they cannot run,
:func:`load` raises :class:`KernelUnavailable` saying why."""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path
from types import ModuleType

FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp")
CPU_FLAGS = ("avx2", "fma")


class KernelUnavailable(RuntimeError):
    """A native kernel cannot run here; the message says why."""


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


def build_problem() -> str | None:
    """Why the kernels cannot be built here (no C++ compiler, no ninja), or None where they can."""
    from torch.utils.cpp_extension import is_ninja_available

    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler found ({compiler!r}; set CXX, or install g++ or clang++)"
    if not is_ninja_available():
        return "torch's extension builder needs ninja (pip install ninja)"
    return None


_LOADED: dict[str, ModuleType | KernelUnavailable] = {}


def load(name: str) -> ModuleType:
    """The extension built from ``<name>.cpp`` beside this file, or :class:`KernelUnavailable` (kept per process)."""
    if name not in _LOADED:
        try:
            _LOADED[name] = _build(name)
        except KernelUnavailable as e:
            _LOADED[name] = e
    found = _LOADED[name]
    if isinstance(found, KernelUnavailable):
        raise found
    return found


def _build(name: str) -> ModuleType:
    problem = cpu_problem() or build_problem()
    if problem:
        raise KernelUnavailable(problem)
    from torch.utils.cpp_extension import load as load_extension

    source = Path(__file__).with_name(f"{name}.cpp")
    try:
        return load_extension(f"grouprl_{name}", [str(source)], extra_cflags=list(FLAGS), extra_ldflags=["-fopenmp"])
    except (RuntimeError, OSError, ImportError) as e:  # the compiler's or the loader's complaint, shortened
        detail = "\n".join(str(e).strip().splitlines()[-5:])
        raise KernelUnavailable(f"building {source.name} failed:\n{detail}") from e
