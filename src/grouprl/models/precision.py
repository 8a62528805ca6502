"""The number format of each phase of a run, decided from what the machine is, never from a timing: a choice
that changes a run's numbers must not depend on the moment. ``dtype: auto`` takes the first row of :data:`RULES`
whose features the machine has; the run records the choice, so a resume repeats it anywhere.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from grouprl.errors import ConfigError
from grouprl.rollout.formats import format_problem

ONEDNN_ISAS = {name: rank for rank, names in enumerate((
    ("SSE41",), ("AVX",), ("AVX2",), ("AVX2_VNNI",), ("AVX2_VNNI_2",), ("AVX512_CORE",), ("AVX512_CORE_VNNI",),
    ("AVX512_CORE_BF16",), ("AVX10_1_512", "AVX512_CORE_FP16"), ("AVX10_1_512_AMX", "AVX512_CORE_AMX"),
    ("AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16"), ("AVX10_2_512",), ("AVX10_2_512_AMX_2",))) for name in names}
"""``ONEDNN_MAX_CPU_ISA`` values, lowest first (two names of one rank are aliases); any other value caps nothing."""


@dataclass(frozen=True)
class Machine:
    """What the rules read: where the run computes and, on a CPU, the features its kernels may use (``vendor`` and
    ``flags`` from ``/proc/cpuinfo``, ``capability`` ATen's after ``ATEN_CPU_CAPABILITY``, ``onednn_cap``
    ``ONEDNN_MAX_CPU_ISA``)."""

    device: str = "cpu"
    gpu_bf16: bool = False
    gpu_name: str = ""
    vendor: str = ""
    flags: frozenset[str] = frozenset()
    capability: str = "DEFAULT"
    onednn_cap: str = ""
    arch: str = "x86_64"

    def onednn_allows(self, isa: str) -> bool:
        cap = ONEDNN_ISAS.get(self.onednn_cap)
        return cap is None or cap >= ONEDNN_ISAS[isa]

    @property
    def avx512(self) -> bool:
        return self.capability.startswith("AVX512") and self.onednn_allows("AVX512_CORE")

    @property
    def bf16_units(self) -> bool:
        """AVX-512 BF16 dot products that both ATen and oneDNN may use."""
        return self.avx512 and "avx512_bf16" in self.flags and self.onednn_allows("AVX512_CORE_BF16")

    @property
    def amx(self) -> bool:
        """AMX bf16 tiles that oneDNN may use."""
        return self.avx512 and {"amx_bf16", "amx_tile"} <= self.flags and self.onednn_allows("AVX512_CORE_AMX")

    @property
    def avx2(self) -> bool:
        return self.arch in ("x86_64", "amd64") and {"avx2", "fma"} <= self.flags and \
            self.capability.startswith(("AVX2", "AVX512")) and self.onednn_allows("AVX2")

    def describe(self) -> str:
        if self.device == "cuda":
            return self.gpu_name or "a CUDA GPU"
        units = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in self.flags]
        caps = f"; kernels {self.capability}" + (f", ONEDNN_MAX_CPU_ISA={self.onednn_cap}" if self.onednn_cap else "")
        return f"{self.vendor or self.arch} ({' '.join(units) or 'no vector flags'}{caps})"


def _cpuinfo(path: str = "/proc/cpuinfo") -> tuple[str, frozenset[str]]:
    vendor, flags = "", frozenset()
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "vendor_id" and not vendor:
                    vendor = value.strip()
                elif key.strip() == "flags":
                    flags = frozenset(value.split())
                    break
    except OSError:
        pass
    return vendor, flags


def this_machine(device: torch.device | None = None) -> Machine:
    """The :class:`Machine` this process computes on (``device`` None: the CPU)."""
    if device is not None and device.type == "cuda":
        return Machine("cuda", torch.cuda.is_bf16_supported(), torch.cuda.get_device_name(device))
    vendor, flags = _cpuinfo()
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").upper()
    return Machine("cpu", vendor=vendor, flags=flags, capability=torch.backends.cpu.get_cpu_capability(),
                   onednn_cap=cap, arch=platform.machine().lower())


@dataclass(frozen=True)
class Rule:
    """One row of :data:`RULES`: the machines it covers, the format of each phase there, the reason printed at
    start, and the committed measurement it rests on."""

    name: str
    applies: Callable[[Machine], bool]
    rollout: str
    train: str
    reference: str
    why: str
    measured: str


RULES: tuple[Rule, ...] = (
    Rule("gpu-bf16", lambda m: m.device == "cuda" and m.gpu_bf16, "bf16", "bf16", "bf16",
         "a GPU with bf16 units", "gpu-h100/, gpu-h200/"),
    Rule("gpu", lambda m: m.device == "cuda", "fp32", "fp32", "fp32", "a GPU without bf16 units", "none"),
    Rule("amx", lambda m: m.amx, "bf16", "bf16", "bf16", "AMX bf16 units",
         "products/xeon-amx.log: 16-row decode step 25.6 ms bf16 vs 52.6 fp32"),
    Rule("avx512-bf16-amd", lambda m: m.bf16_units and m.vendor == "AuthenticAMD", "bf16", "bf16", "bf16",
         "AVX-512 BF16 on an AMD CPU", "products/zen4.log: 54.5 ms bf16 vs 96.2 fp32; dtype-auto/README.md"),
    Rule("avx512-bf16-no-amx", lambda m: m.bf16_units, "fp32", "fp32", "fp32",
         "AVX-512 BF16 without AMX (bf16 no faster than fp32 here)",
         "formats/xeon-avx512-bf16-no-amx.log: bf16 0.55x fp32 training, 1.00x decode"),
    Rule("avx2", lambda m: m.avx2, "fp32", "fp32", "fp32", "AVX2 without bf16 units",
         "products/xeon-avx2-capped.log, zen4-avx2-capped.log: bf16 2.5x slower; bf16-weights-rollouts/README.md"),
    Rule("other", lambda m: True, "fp32", "fp32", "fp32", "no measured faster format on this CPU", "none"),
)
"""The machines ``dtype: auto`` knows, in order: the first row that applies decides."""


def rule_for(machine: Machine) -> Rule:
    """The first of :data:`RULES` that applies to ``machine``."""
    return next(rule for rule in RULES if rule.applies(machine))


@dataclass(frozen=True)
class Formats:
    """The number format of each phase of a run, and why: fp32 or bf16 for training (bf16: autocast over fp32
    master weights) and the reference's storage; also a weight-only format for the rollouts."""

    rollout: str
    train: str
    reference: str
    rule: str  # the RULES row that decided (when the run started), or "forced" by the config's dtype
    reason: str

    def describe(self) -> str:
        return (f"rollouts {self.rollout}, training {self.train}, reference {self.reference} — {self.reason} "
                f"(rule {self.rule})")

    def as_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Formats | None:
        """The formats a checkpoint recorded (None where it recorded none, or something else)."""
        try:
            return cls(**{k: str(data[k]) for k in ("rollout", "train", "reference", "rule", "reason")})
        except (KeyError, TypeError):
            return None


def resolve_formats(dtype: str, ref_dtype: str, rollout_dtype: str, device: torch.device | None = None,
                    machine: Machine | None = None, recorded: Formats | None = None) -> Formats:
    """The formats for ``dtype``, ``ref_dtype`` and ``rollout_dtype``: what ``auto`` leaves open comes from
    ``recorded`` (a resumed run's), else from :data:`RULES` for ``machine`` (default: this one)."""
    device = device or torch.device("cpu")
    problem = format_problem(rollout_dtype, device) if rollout_dtype != "auto" else None
    if problem:
        raise ConfigError(f"rollout_dtype={problem}: use fp32, bf16 or auto")
    forced = {k: v for k, v in (("dtype", dtype), ("ref_dtype", ref_dtype), ("rollout_dtype", rollout_dtype))
              if v != "auto"}
    if dtype != "auto":
        why = ", ".join(f"{k}={v}" for k, v in forced.items())
        return Formats(forced.get("rollout_dtype", dtype), dtype, forced.get("ref_dtype", "bf16" if dtype == "bf16"
                                                                            else "fp32"), "forced", f"set: {why}")
    if recorded is not None:
        base = Rule(recorded.rule, lambda m: True, recorded.rollout, recorded.train, recorded.reference,
                    f"as the checkpoint recorded ({recorded.reason})", "")
    else:
        machine = machine or this_machine(device)
        base = rule_for(machine)
        base = Rule(base.name, base.applies, base.rollout, base.train, base.reference,
                    f"{base.why}: {machine.describe()}", base.measured)
    overridden = {k: v for k, v in forced.items() if k != "dtype"}
    why = base.why + (f"; set: {', '.join(f'{k}={v}' for k, v in overridden.items())}" if overridden else "")
    return Formats(forced.get("rollout_dtype", base.rollout), base.train, forced.get("ref_dtype", base.reference),
                   base.name, why)


def pinned(formats: Formats) -> dict[str, str]:
    """The config values that repeat ``formats`` exactly (what a run's config.yaml records)."""
    return {"dtype": formats.train, "ref_dtype": formats.reference, "rollout_dtype": formats.rollout}
