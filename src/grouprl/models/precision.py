"""Which number format is fast on this machine, measured, not assumed.

The machines grouprl runs on differ: on an AMD Zen 4 (AVX-512 BF16) bf16 matrix products run 2.3x
faster than fp32, on a Zen 3 (AVX2 only) 65-260x slower, and on an Intel Xeon without AMX exposed
about 0.6-0.8x. ``dtype: auto`` therefore times fp32 against bf16 matrix products at the model's own
shapes, once per machine, and picks per phase:

- rollouts: decode-sized products (half the rollout's rows, since rows end at different steps and most
  steps run fewer than all, x hidden x intermediate, over enough distinct weights to stream them from
  memory as a decode step does: :data:`STREAM_BYTES`). Where bf16 is not picked, on a CPU, also the
  weight-only formats: bf16 copies of the weights with fp32 activations (``bf16-weights``,
  :mod:`grouprl.rollout.bf16_weights`), picked where :data:`MARGIN` faster than fp32, and int8 products with
  bf16 activations (:mod:`grouprl.rollout.int8`), whose ratio is reported but which rollouts use only when
  asked (``rollout_dtype: int8``): on the demo's task, held-out accuracy with int8 rollouts trailed fp32's
  (``benchmarks/results/int8-rollouts/``), so a faster rollout is not yet shown to be a free one;
- training and the reference pass: training-sized products (a micro-batch's tokens x hidden x
  intermediate). Training runs under bf16 autocast with fp32 master weights and optimizer state;
  the frozen reference is stored in bf16 (half its memory) when bf16 is faster.

bf16 is picked only when it is at least :data:`MARGIN` faster than fp32. int8 is not timed where bf16 wins:
there bf16 rollouts also learn faster layouts than the probe's ``x @ W.T`` and compile (``rollout_compile``),
so a probe of single products would flatter int8 against them (on a 2-core Xeon with AMX, one thread, 16 x
64: 88.5 tokens/s in bf16 against 75.5 in int8 eagerly, 144.1 compiled in bf16; ``python
benchmarks/rollout.py --threads 1 --formats bf16,int8 --no_vllm --settings 16x64 --repeats 3 --warmup 1``, log
``benchmarks/results/rollout/xeon-amx-bf16-int8-1thread.log``). ``rollout_dtype`` forces the rollouts' format
on its own. The probe stays well under a
second: bf16 is timed on a small product first, and a machine where it is many times slower is not asked to
run the large one. Results are cached per machine (CPU model and flags, threads, torch
version, shapes) in the user cache folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from grouprl.errors import ConfigError
from grouprl.rollout.weight_only import WEIGHT_ONLY, weight_only_problem

MARGIN = 1.1
"""bf16 is chosen for a phase only when it is at least this many times faster than fp32 there."""
HOPELESS = 4.0
"""A bf16 product this many times slower than fp32 at the small size ends the probe: bf16 loses."""


@dataclass(frozen=True)
class Precision:
    """The number format of each phase, and the measured bf16 speedups (fp32 time / bf16 time)."""

    rollout: str
    """fp32, bf16, bf16-weights or int8 (grouprl.rollout.weight_only)."""
    train: str
    reference: str
    decode_speedup: float | None = None
    train_speedup: float | None = None
    int8_speedup: float | None = None
    """fp32 time / int8-weight time of the decode-sized product (None: not measured, or int8 cannot run)."""
    bf16_weights_speedup: float | None = None
    """fp32 time / bf16-weights time of the decode-sized product (None: not measured, or it cannot run)."""
    how: str = "measured"
    """measured, cached (measured earlier on this machine), forced (dtype: fp32/bf16), or the GPU's name
    (bf16 where it has bf16 units)."""

    def describe(self) -> str:
        """One line for the start of a run and its summary."""
        def ratios(**speedups: float | None) -> str:
            parts = [f"{fmt} {x:.2f}x{' fp32' if i == 0 else ''}"
                     for i, (fmt, x) in enumerate((f, x) for f, x in speedups.items() if x is not None)]
            return f" ({', '.join(parts)})" if parts else ""

        decode = ratios(**{"bf16": self.decode_speedup, "bf16-weights": self.bf16_weights_speedup,
                           "int8": self.int8_speedup})
        return (f"rollouts {self.rollout}{decode}, training "
                f"{self.train}{ratios(bf16=self.train_speedup)}, reference {self.reference} [{self.how}]")


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


def _median_seconds(product: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds of ``product()`` over ``repeats`` calls, after one warm-up."""
    product()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        product()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _time(m: int, k: int, n: int, dtype: torch.dtype, device: torch.device, repeats: int = 3,
          count: int = 1) -> float:
    """Median seconds of ``[m, k]`` times ``count`` distinct ``[n, k]`` weights' transposes (as ``nn.Linear``
    multiplies), in ``dtype``, after one warm-up."""
    a = torch.rand(m, k, device=device).to(dtype)
    weights = [torch.rand(n, k, device=device).to(dtype) for _ in range(count)]
    return _median_seconds(lambda: [F.linear(a, w) for w in weights], device, repeats)


def _time_int8(m: int, k: int, n: int, repeats: int = 3, count: int = 1) -> float:
    """As :func:`_time` for int8 decoding's product: bf16 ``[m, k]`` times int8 ``[n, k]`` weights' transposes."""
    a = torch.rand(m, k).bfloat16()
    weights = [(torch.randint(-127, 128, (n, k), dtype=torch.int8), torch.rand(n).bfloat16()) for _ in range(count)]
    return _median_seconds(lambda: [torch.ops.aten._weight_int8pack_mm(a, q, s) for q, s in weights],
                           torch.device("cpu"), repeats)


def _time_bf16_weights(m: int, k: int, n: int, repeats: int = 3, count: int = 1) -> float:
    """As :func:`_time` for the bf16-weights product: fp32 ``[m, k]`` times bf16 ``[n, k]`` weights' transposes."""
    from grouprl.rollout.bf16_weights import pack, product

    a = torch.rand(m, k)
    panels = [pack(torch.rand(n, k))[0] for _ in range(count)]
    return _median_seconds(lambda: [product(a, p) for p in panels], torch.device("cpu"), repeats)


STREAM_BYTES = 64 << 20
"""Decode-sized products cycle through distinct weights of this many fp32 bytes in all. A decode step reads
each weight from memory once, not from a cache that a single probe weight would sit in; the bytes a format
does not read (int8 reads a quarter of fp32's) are much of what it gains there."""


def streamed(k: int, n: int) -> int:
    """How many distinct ``[n, k]`` weights a decode-sized probe cycles through."""
    return max(1, -(-STREAM_BYTES // (4 * k * n)))


def bf16_speedup(m: int, k: int, n: int, device: torch.device, count: int = 1) -> float:
    """fp32 time over bf16 time of ``[m, k]`` times ``count`` ``[n, k]`` weights (> 1: bf16 is faster)."""
    small = min(m, 64)  # few-row bf16 products can be near fp32 on a CPU where training-sized ones are hopeless
    fp32 = _time(small, k, n, torch.float32, device, count=count)
    bf16 = _time(small, k, n, torch.bfloat16, device, count=count)
    if bf16 > HOPELESS * fp32 or m == small:
        return fp32 / bf16
    return _time(m, k, n, torch.float32, device, count=count) / _time(m, k, n, torch.bfloat16, device, count=count)


def int8_speedup(m: int, k: int, n: int, device: torch.device, count: int = 1) -> float | None:
    """fp32 time over int8-weight time of ``[m, k]`` times ``count`` ``[n, k]`` weights (> 1: int8 is faster);
    None where int8 decoding cannot run (not a CPU, or an input width the kernel does not take)."""
    from grouprl.rollout.int8 import WIDTH_MULTIPLE

    if device.type != "cpu" or k % WIDTH_MULTIPLE:
        return None
    return _time(m, k, n, torch.float32, device, count=count) / _time_int8(m, k, n, count=count)


def bf16_weights_speedup(m: int, k: int, n: int, device: torch.device, count: int = 1) -> float | None:
    """fp32 time over bf16-weights time of ``[m, k]`` times ``count`` ``[n, k]`` weights (> 1: bf16-weights is
    faster); None where it cannot run (not a CPU, the kernels unavailable here, or a shape they do not take)."""
    from grouprl.rollout.bf16_weights import takes

    if device.type != "cpu" or not takes(n, k) or WEIGHT_ONLY["bf16-weights"].unavailable():
        return None
    return _time(m, k, n, torch.float32, device, count=count) / _time_bf16_weights(m, k, n, count=count)


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
                     cache: Path | None = None, device: torch.device | None = None,
                     rollout_dtype: str = "auto") -> Precision:
    """The format of each phase for ``dtype`` (auto, fp32 or bf16), ``ref_dtype`` (auto, fp32, bf16) and
    ``rollout_dtype`` (auto: as ``dtype``; fp32, bf16, bf16-weights, int8): auto measures (or reads the cache),
    the others force. ``decode_rows`` and ``train_tokens`` size the probe like the run's rollouts and micro-batches;
    ``device`` is where the run will compute (default: where ``model`` is now). On a GPU, auto is bf16
    wherever the card has bf16 units."""
    forced_ref = None if ref_dtype == "auto" else ref_dtype
    forced_rollout = None if rollout_dtype == "auto" else rollout_dtype
    device = device or next((p.device for p in model.parameters()), torch.device("cpu"))
    problem = weight_only_problem(forced_rollout or "", device)
    if problem:
        raise ConfigError(f"rollout_dtype={problem}: use fp32, bf16 or auto")
    if dtype != "auto":
        return Precision(forced_rollout or dtype, dtype, forced_ref or ("bf16" if dtype == "bf16" else "fp32"),
                         how="forced")
    if device.type == "cuda":
        # A probe at these sizes would time kernel launches, not arithmetic; bf16 units run every
        # product of a training step at least as fast as fp32 (tf32 included) and halve the bytes moved.
        fmt = "bf16" if torch.cuda.is_bf16_supported() else "fp32"
        return Precision(forced_rollout or fmt, fmt, forced_ref or fmt, how=torch.cuda.get_device_name(device))
    hidden, width = model_shape(model)
    decode_rows, train_tokens = max(1, min((decode_rows + 1) // 2, 256)), max(16, min(train_tokens, 2048))
    key = hashlib.sha1(json.dumps([_cpu_key(), device.type, torch.get_num_threads(), torch.__version__, hidden,
                                   width, decode_rows, train_tokens, STREAM_BYTES]).encode()).hexdigest()
    path = cache or _cache_path()
    cached = _read_cache(path).get(key)
    optional = lambda x: None if x is None else float(x)  # noqa: E731
    if isinstance(cached, dict) and {"decode", "train", "int8", "bf16_weights"} <= set(cached):
        decode, train, how = float(cached["decode"]), float(cached["train"]), "cached"
        int8, weights = optional(cached["int8"]), optional(cached["bf16_weights"])
    else:
        decode = bf16_speedup(decode_rows, hidden, width, device, count=streamed(hidden, width))
        train = bf16_speedup(train_tokens, hidden, width, device)
        int8 = weights = None
        if decode < MARGIN:
            int8 = int8_speedup(decode_rows, hidden, width, device, count=streamed(hidden, width))
            weights = bf16_weights_speedup(decode_rows, hidden, width, device, count=streamed(hidden, width))
        how = "measured"
        _write_cache(path, key, {"decode": decode, "train": train, "int8": int8, "bf16_weights": weights})
    pick = lambda speedup: "bf16" if speedup >= MARGIN else "fp32"  # noqa: E731
    rollout = pick(decode)
    if rollout == "fp32" and weights is not None and weights >= MARGIN:
        rollout = "bf16-weights"
    return Precision(forced_rollout or rollout, pick(train), forced_ref or pick(train), decode, train, int8,
                     weights, how)


def _write_cache(path: Path, key: str, value: dict[str, float | None]) -> None:
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
