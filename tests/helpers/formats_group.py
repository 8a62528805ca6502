"""A 2-process run at the default ``dtype: auto`` (the entry point of ``mp.spawn`` for
tests/trainer/distributed/test_formats.py): process 1 is told it runs on another kind of machine, so that a
decision of its own would differ from process 0's."""

from __future__ import annotations

import faulthandler
import traceback
from pathlib import Path
from typing import Any

import torch

import grouprl.models.precision as precision
from tests.helpers.dist import build, full_weights, metrics_lines

AMX = precision.Machine(vendor="GenuineIntel", capability="AVX512",
                        flags=frozenset({"avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}))
AVX2 = precision.Machine(vendor="AuthenticAMD", flags=frozenset({"avx2", "fma"}), capability="AVX2")
SETTINGS = {"engine": "ddp", "dtype": "auto", "ref_dtype": "auto", "rollout_dtype": "auto"}


def other_machine() -> precision.Machine:
    """A machine whose rule differs from this one's."""
    real = precision.rule_for(precision.this_machine())
    return AVX2 if real.train == "bf16" else AMX


def formats_group(rank: int, world: int, store_file: str, out: str) -> None:
    faulthandler.enable()
    torch.set_num_threads(1)
    from grouprl.trainer.dist.group import init_distributed

    env = init_distributed(rank=rank, world_size=world, init_method=f"file://{store_file}", device="cpu",
                           timeout_s=240)
    out = Path(out)
    if rank == 1:
        machine = other_machine()
        precision.this_machine = lambda device=None: machine
    try:
        trainer = build(out, "auto", env=env, **SETTINGS)
        trainer.train()
        result: dict[str, Any] = {"formats": trainer.formats, "config_dtype": trainer.config.dtype,
                                  "weights": full_weights(trainer), "metrics": metrics_lines(out / "auto" / "run", env)}
    except Exception as e:  # noqa: BLE001 - recorded for the test to read
        result = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()}
    torch.save(result, out / f"auto-rank{rank}.pt")
