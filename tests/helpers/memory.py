"""Peak tensor memory of a CPU computation, from PyTorch's profiler: every allocation and free, each
tensor put in a category (activation, gradient, parameter, temporary...), whatever the allocator."""

from __future__ import annotations

import json
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

CATEGORIES = ("PREEXISTING", "PARAMETER", "OPTIMIZER_STATE", "INPUT", "TEMPORARY", "ACTIVATION", "GRADIENT",
              "AUTOGRAD_DETAIL", "UNKNOWN")


def peak_bytes(fn: Callable[[], object]) -> tuple[int, dict[str, int]]:
    """Run ``fn`` under the profiler: (peak bytes of tensors allocated while it ran, by category at that
    moment)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the timeline export is marked for a future removal
        path = Path(folder) / "timeline.json"
        prof.export_memory_timeline(str(path), device="cpu")
        _, sizes = json.loads(path.read_text())
    totals = [sum(s) for s in sizes]
    at = max(range(len(totals)), key=totals.__getitem__)
    return totals[at], dict(zip(CATEGORIES, sizes[at]))
