"""vLLM's CPU worker binds the process's memory to one NUMA node and makes ``torch.set_num_threads`` a no-op:
:func:`kept_process_state` puts both back after an in-process engine is built."""

from __future__ import annotations

import contextlib
import ctypes
import platform
import sys
from collections.abc import Iterator

import torch

_MEMPOLICY_CALLS = {"x86_64": (239, 238), "aarch64": (236, 237)}  # (get_mempolicy, set_mempolicy) numbers
_MASK_WORDS = 16  # room for 1024 NUMA nodes: get_mempolicy refuses a mask smaller than the kernel's node count
MPOL_DEFAULT = 0


def _libc():
    calls = _MEMPOLICY_CALLS.get(platform.machine())
    if not sys.platform.startswith("linux") or calls is None:
        return None, None
    return ctypes.CDLL(None, use_errno=True), calls


def memory_policy() -> tuple[int, tuple[int, ...]] | None:
    """(mode, node mask words) of the calling thread's NUMA memory policy, or None where it cannot be read."""
    libc, calls = _libc()
    if libc is None:
        return None
    mode, mask = ctypes.c_int(0), (ctypes.c_ulong * _MASK_WORDS)()
    if libc.syscall(calls[0], ctypes.byref(mode), mask, ctypes.c_ulong(_MASK_WORDS * 64), None, ctypes.c_ulong(0)):
        return None
    return mode.value, tuple(mask)


def set_memory_policy(policy: tuple[int, tuple[int, ...]]) -> bool:
    """Make ``policy`` the calling thread's memory policy; False if refused."""
    libc, calls = _libc()
    if libc is None:
        return False
    mode, words = policy
    if mode == MPOL_DEFAULT:  # the kernel takes no node mask with the default policy
        return libc.syscall(calls[1], ctypes.c_int(mode), None, ctypes.c_ulong(0)) == 0
    mask = (ctypes.c_ulong * _MASK_WORDS)(*words)
    return libc.syscall(calls[1], ctypes.c_int(mode), mask, ctypes.c_ulong(_MASK_WORDS * 64)) == 0


@contextlib.contextmanager
def kept_process_state() -> Iterator[None]:
    """The memory policy (best effort) and ``torch.set_num_threads`` as before, afterwards."""
    set_threads, policy = torch.set_num_threads, memory_policy()
    try:
        yield
    finally:
        torch.set_num_threads = set_threads
        if policy is not None and memory_policy() != policy:
            set_memory_policy(policy)
