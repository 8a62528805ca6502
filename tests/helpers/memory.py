"""Peak bytes of CPU tensors while a function runs, by kind, from PyTorch's profiler (for memory tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TENSOR_KINDS = ("PREEXISTING", "PARAMETER", "OPTIMIZER_STATE", "INPUT", "TEMPORARY", "ACTIVATION", "GRADIENT",
                "AUTOGRAD_DETAIL", "UNKNOWN")
"""The kinds PyTorch's profiler sorts CPU tensors into (its memory timeline's columns)."""


def peak_tensor_bytes(fn: Any) -> tuple[int, dict[str, int]]:
    """Run ``fn()`` under PyTorch's profiler: the peak bytes of CPU tensors allocated while it ran, and
    that moment's bytes by kind (:data:`TENSOR_KINDS`), whatever the allocator keeps besides. The kinds
    come from the autograd graph: run a backward pass inside ``fn`` for activations to count as such."""
    import tempfile
    import warnings

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the timeline export is marked for a future removal
        path = Path(folder) / "timeline.json"
        prof.export_memory_timeline(str(path), device="cpu")
        _, sizes = json.loads(path.read_text())
    totals = [sum(s) for s in sizes]
    at = max(range(len(totals)), key=totals.__getitem__)
    return totals[at], dict(zip(TENSOR_KINDS, sizes[at]))
