"""The machine a benchmark ran on, printed first by every benchmark: the CPU's model name, its
cores, and the flags that decide which number format is fast (avx2, avx512_bf16, amx_bf16), and any
instruction-set limit the run was given: ``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`` makes
PyTorch's kernels and oneDNN's matrix products use AVX2 only, which measures an AVX2-only CPU's code
paths (bf16 products tens of times slower than fp32, as on a Zen 3; ``vs_trl.py``'s header line gives
the dtype probe's ratio) on a CPU that has more. ``MKL_ENABLE_INSTRUCTIONS=AVX2`` does the same for MKL,
whose fp32 products (``x @ W.T`` and the update's) the other two leave alone."""

from __future__ import annotations

import os
import platform

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
ISA_LIMITS = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")


def cpu_info() -> dict[str, str]:
    """Model name, logical cores and the relevant flags, read from /proc/cpuinfo (Linux)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
    except OSError:
        pass
    return {"cpu": model, "cores": str(os.cpu_count()), "flags": " ".join(f for f in FLAGS if f in flags) or "none"}


def cpu_line() -> str:
    """``cpu: <model> (<n> cores; avx2 avx512_bf16 ...)``."""
    info = cpu_info()
    limits = [f"{k}={os.environ[k]}" for k in ISA_LIMITS if os.environ.get(k)]
    limited = f"; limited to {' '.join(limits)}" if limits else ""
    return f"cpu: {info['cpu']} ({info['cores']} cores; {info['flags']}{limited})"


def start_under_allocator(allocator: str, threads: int) -> None:
    """What a benchmark that runs grouprl's code does first: start itself again under the allocator the
    ``grouprl`` command would preload (``allocator`` as grouprl's setting), then print the CPU and the
    allocator and set torch's intra-op threads."""
    import sys

    import torch

    from grouprl.run.allocator import describe, restart_with_allocator

    restart_with_allocator(allocator, [sys.executable, *sys.argv])
    print(cpu_line(), flush=True)
    print(f"allocator: {describe()}", flush=True)
    torch.set_num_threads(threads)


if __name__ == "__main__":
    print(cpu_line())
