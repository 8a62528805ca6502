"""The compiled decode step when processes of different vector widths share inductor's on-disk cache.

A run capped to AVX2 (``ATEN_CPU_CAPABILITY=avx2``, as the project's AVX2 checks run) and a run at the CPU's
own width (AVX-512 here) compile the same graph. Inductor writes its C++ for the width it picks, but its FX
graph cache key leaves that width out, so the second run used to load the first run's C++ and build it for
its own width: AVX2 code built for AVX-512 stored 32 floats per 16-float step and overran the logits buffer
(glibc: "corrupted size vs. prev_size"). Each order runs in subprocesses so that a heap abort fails the test
rather than killing pytest. On a CPU without AVX-512 both runs pick AVX2 and this checks nothing more than
a compiled bf16 step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
TOLERANCE = 0.02
"""Largest |compiled - eager| logit allowed: both run in bf16 and inductor orders its sums its own way (the
bound test_compiled.py holds the bf16 models to)."""


def child() -> None:
    """A subprocess's body: the tiny test model's bf16 decode steps (rows dropped on the way) through a fresh
    compiled step and eagerly; prints one JSON line with the vector width inductor picked, the compiled steps
    and, per step, the largest logit difference and whether the top tokens agree."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    from grouprl.models import tiny_causal_lm
    from grouprl.rollout.cpu.compiled import CompiledStep
    from grouprl.rollout.runner import run_with_bf16_weights
    from tests.rollout.cpu.test_compiled import steps

    model, _ = tiny_causal_lm(seed=0)  # the trainer tests' model: head_dim 16, vocabulary 260
    compiled = CompiledStep()
    with torch.inference_mode():
        got = run_with_bf16_weights(model, lambda m: steps(m, compiled))
        want = run_with_bf16_weights(model, lambda m: steps(m, None))
    print(json.dumps({
        "isa": str(pick_vec_isa()), "steps": compiled.steps,
        "diff": [(g - w).abs().max().item() for g, w in zip(got, want, strict=True)],
        "same_top": [torch.equal(g.argmax(-1), w.argmax(-1)) for g, w in zip(got, want, strict=True)],
    }))


def run_child(cache: Path, capability: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    if capability is not None:
        env["ATEN_CPU_CAPABILITY"] = capability
    done = subprocess.run([sys.executable, "-c", "from tests.rollout.cpu.test_compiled_isa import child; child()"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (f"the compiled bf16 steps (ATEN_CPU_CAPABILITY={capability}) exited with "
                                  f"{done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("order", [("avx2", None), (None, "avx2")], ids=["avx2-first", "native-first"])
def test_runs_of_different_vector_widths_share_the_compile_cache_safely(tmp_path, order):
    for capability in order:
        result = run_child(tmp_path / "inductor", capability)
        # ROWS_KEPT: 8 decode steps of 4, 4, 3, 3, 2, 2, 1, 1 rows; the 1-row ones run eagerly
        assert result["steps"] == 6, result
        # all(d <= ...) rather than max(diff) <= ...: a NaN (what a graph built for another width gave) fails it
        assert all(d <= TOLERANCE for d in result["diff"]), (
            f"ATEN_CPU_CAPABILITY={capability} ({result['isa']}): compiled logits from eager by {result['diff']}")
        assert all(result["same_top"]), result
