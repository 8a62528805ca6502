"""Which number format is fast on this machine, measured, not assumed.

The machines grouprl runs on differ: on an AMD Zen 4 (AVX-512 BF16) bf16 matrix products run 2.3x
faster than fp32, on a Zen 3 (AVX2 only) 65-260x slower, and on an Intel Xeon without AMX exposed
about 0.6-0.8x. ``dtype: auto`` therefore times fp32 against bf16 matrix products at the model's own
shapes, once per machine, and picks per phase:

- rollouts: decode-sized products (the rollout's rows x hidden x intermediate);
- training and the reference pass: training-sized products (a micro-batch's tokens x hidden x
  intermediate). Training runs under bf16 autocast with fp32 master weights and optimizer state;
  the frozen reference is stored in bf16 (half its memory) when bf16 is faster.

A format is picked only when it is at least :data:`MARGIN` faster. The probe stays well under a
second: bf16 is timed on a small product first, and a machine where it is many times slower is not
asked to run the large one. Results are cached per machine (CPU model and flags, threads, torch
version, shapes) in the user cache folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

MARGIN = 1.1
"""bf16 is chosen for a phase only when it is at least this many times faster than fp32 there."""
HOPELESS = 4.0
"""A bf16 product this many times slower than fp32 at the small size ends the probe: bf16 loses."""


@dataclass(frozen=True)
class Precision:
    """The number format of each phase, and the measured bf16 speedups (fp32 time / bf16 time)."""

    rollout: str
    train: str
    reference: str
    decode_speedup: float | None = None
    train_speedup: float | None = None
    how: str = "measured"
    """measured, cached (measured earlier on this machine), forced (dtype: fp32/bf16), or the GPU's name
    (bf16 where it has bf16 units)."""

    def describe(self) -> str:
        """One line for the start of a run and its summary."""
        def ratio(x: float | None) -> str:
            return "" if x is None else f" (bf16 {x:.2f}x fp32)"

        return (f"rollouts {self.rollout}{ratio(self.decode_speedup)}, training {self.train}"
                f"{ratio(self.train_speedup)}, reference {self.reference} [{self.how}]")


def _cpu_key() -> str:
    model, flags = "", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = " ".join(sorted(f for f in value.split() if "avx" in f or "amx" in f or "fma" in f))
    except OSError:
        pass
    # What the kernels may use, not only what the CPU has: ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA cap
    # it (an AVX2 cap makes bf16 products tens of times slower on a CPU whose flags say avx512_bf16).
    used = f"{torch.backends.cpu.get_cpu_capability()}|{os.environ.get('ONEDNN_MAX_CPU_ISA', '')}"
    return f"{model}|{flags}|{used}"


def _time(m: int, k: int, n: int, dtype: torch.dtype, device: torch.device, repeats: int = 3) -> float:
    """Median seconds of ``[m, k] @ [k, n]`` in ``dtype`` (after one warm-up)."""
    a = torch.randn(m, k, device=device).to(dtype)
    w = torch.randn(k, n, device=device).to(dtype)
    a @ w
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        a @ w
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def bf16_speedup(m: int, k: int, n: int, device: torch.device) -> float:
    """fp32 time over bf16 time of an ``[m, k] @ [k, n]`` product (> 1: bf16 is faster)."""
    small = min(m, 16)
    fp32, bf16 = _time(small, k, n, torch.float32, device), _time(small, k, n, torch.bfloat16, device)
    if bf16 > HOPELESS * fp32 or m == small:
        return fp32 / bf16
    return _time(m, k, n, torch.float32, device) / _time(m, k, n, torch.bfloat16, device)


def model_shape(model: torch.nn.Module) -> tuple[int, int]:
    """(hidden size, MLP width) of a transformers model (the largest products of a forward)."""
    config = getattr(model, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = int(getattr(config, "hidden_size", 0) or 0) or 512
    return hidden, int(getattr(config, "intermediate_size", 0) or 0) or 4 * hidden


def _cache_path() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "grouprl" / "precision.json"


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def choose_precision(dtype: str, ref_dtype: str, model: torch.nn.Module, decode_rows: int, train_tokens: int,
                     cache: Path | None = None, device: torch.device | None = None) -> Precision:
    """The format of each phase for ``dtype`` (auto, fp32 or bf16) and ``ref_dtype`` (auto, fp32, bf16):
    auto measures (or reads the cache), the others force. ``decode_rows`` and ``train_tokens`` size the
    probe like the run's rollouts and micro-batches; ``device`` is where the run will compute (default:
    where ``model`` is now). On a GPU, auto is bf16 wherever the card has bf16 units."""
    forced_ref = None if ref_dtype == "auto" else ref_dtype
    if dtype != "auto":
        return Precision(dtype, dtype, forced_ref or ("bf16" if dtype == "bf16" else "fp32"), how="forced")
    device = device or next((p.device for p in model.parameters()), torch.device("cpu"))
    if device.type == "cuda":
        # A probe at these sizes would time kernel launches, not arithmetic; bf16 units run every
        # product of a training step at least as fast as fp32 (tf32 included) and halve the bytes moved.
        fmt = "bf16" if torch.cuda.is_bf16_supported() else "fp32"
        return Precision(fmt, fmt, forced_ref or fmt, how=torch.cuda.get_device_name(device))
    hidden, width = model_shape(model)
    decode_rows, train_tokens = max(1, min(decode_rows, 256)), max(16, min(train_tokens, 2048))
    key = hashlib.sha1(json.dumps([_cpu_key(), device.type, torch.get_num_threads(), torch.__version__, hidden,
                                   width, decode_rows, train_tokens]).encode()).hexdigest()
    path = cache or _cache_path()
    cached = _read_cache(path).get(key)
    if isinstance(cached, dict) and {"decode", "train"} <= set(cached):
        decode, train, how = float(cached["decode"]), float(cached["train"]), "cached"
    else:
        decode = bf16_speedup(decode_rows, hidden, width, device)
        train = bf16_speedup(train_tokens, hidden, width, device)
        how = "measured"
        _write_cache(path, key, {"decode": decode, "train": train})
    pick = lambda speedup: "bf16" if speedup >= MARGIN else "fp32"  # noqa: E731
    return Precision(pick(decode), pick(train), forced_ref or pick(train), decode, train, how)


def _write_cache(path: Path, key: str, value: dict[str, float]) -> None:
    """Add ``key`` to the cache file (best effort: a read-only home only costs a new probe next time)."""
    try:
        data = _read_cache(path)
        data[key] = value
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass


def as_dict(precision: Precision) -> dict[str, Any]:
    return asdict(precision)
