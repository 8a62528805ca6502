"""The machine a benchmark ran on, printed first by every benchmark: the CPU's model name, its
cores, and the flags that decide which number format is fast (avx2, avx512_bf16, amx_bf16)."""

from __future__ import annotations

import os
import platform

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


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
    return f"cpu: {info['cpu']} ({info['cores']} cores; {info['flags']})"


if __name__ == "__main__":
    print(cpu_line())
