"""Every benchmark still runs: each script's ``--smoke`` mode (the tiny model, the smallest shapes) exits 0 and
prints the figure line its full run prints, so a renamed field or function breaks a test here rather than a
command the docs publish. The figures themselves mean nothing at these shapes and are not checked."""

from __future__ import annotations

import getpass
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
NUMBER = r"(?:[-\d.]+|inf|nan)"

FIGURES = {
    "activations": rf"^saved_mib={NUMBER} time_ratio={NUMBER}$",
    "agent": rf"^speedup={NUMBER}$",
    "async_step": rf"^colocated: {NUMBER} steps/s",
    "attention": rf"^fused_over_products\[fp32\]={NUMBER}$",
    "calibrate_arithmetic": rf'^ "accuracy": {NUMBER},$',
    "calibrate_envs": rf"^success {NUMBER}  all-equal groups 1/1",
    "compiled_step": rf"^compiled_speedup={NUMBER}$",
    "formats": rf"^training: 8 rows x 1 weight\(s\) .*: bf16 {NUMBER}x fp32",
    "gigpo_agent": rf"^success_gain_ratio={NUMBER}",
    "gigpo_cartpole": rf"^steps_ratio={NUMBER}$",
    "gpu_step": rf"^grouprl_step_s={NUMBER} ",
    "head": rf"^fused_speedup_fp32={NUMBER} fused_speedup_bf16={NUMBER}$",
    "judge_arithmetic": rf"^accuracy_ratio={NUMBER}",
    "judge_injection": rf"^injection_win_rate={NUMBER}$",
    "learning": r"^step_ratio=nan time_gain_ratio=nan$",  # no TRL in a smoke run: no ratio to take
    "limit": rf"^mfu_training={NUMBER} mfu_step={NUMBER} peak_fp32_gflops={NUMBER} peak_bf16_gflops={NUMBER}$",
    "memory": rf"^peak_rss_mib={NUMBER} held_mib={NUMBER}$",
    "optimizer_8bit": rf"^slowdown={NUMBER} first_step_s={NUMBER} per_135m_params_s={NUMBER}$",
    "packing": rf"^train_speedup={NUMBER} reference_speedup={NUMBER}$",
    "products": r"^16-row step, stacked +.* ms$",
    "profile_step": rf"^rollout_products={NUMBER} update_products={NUMBER}$",
    "push_memory": rf"^streamed_mib={NUMBER} whole_mib={NUMBER} ratio={NUMBER} model_mib={NUMBER}$",
    "rollout": rf"^speedup={NUMBER}$",
    "rollout_servers": rf"^weight sync \(tiny64, fp32\): .* s; mean {NUMBER} s$",
    "sampling": rf"^speedup={NUMBER}$",
    "sandbox": rf"^overhead_ms={NUMBER}$",
    "step_engines": rf"^step_speedup={NUMBER}$",
    "trpo_cost": r'^\{"method": "trpo", "model": "tiny", .*"update_s"',
    "vllm_compile": rf"^compiled_speedup={NUMBER} extra_start_s={NUMBER} push_followed=(true|false)$",
    "vllm_seeds": rf"^seeded_over_unseeded={NUMBER} eos_over_ignore_eos={NUMBER}$",
    "vs_trl": rf"^grouprl_s_per_step={NUMBER} grouprl_peak_rss_mb={NUMBER}$",
}
"""Script -> the line (a regular expression, matched against each line of its output) its smoke run must print."""

ALSO = {"learning": rf"^peak RSS {NUMBER} MiB at most at once: this process {NUMBER}, .* evaluation [1-9]"}
"""Script -> a second line its smoke run must print (the learning benchmark's memory bound, with a measured
evaluation)."""

NEEDS = {"optimizer_8bit": "torchao", "rollout_servers": "vllm", "step_engines": "vllm", "vllm_compile": "vllm",
         "vllm_seeds": "vllm"}
"""Scripts that need a package the test environment may lack (benchmarks/requirements.txt, or vLLM)."""


def scripts() -> list[str]:
    """The benchmark scripts: every module of benchmarks/ with a ``main`` (the rest are their shared parts)."""
    return sorted(p.stem for p in BENCHMARKS.glob("*.py") if re.search(r"^def main\(", p.read_text(), re.M))


def test_every_benchmark_has_a_smoke_run_checked_here():
    found = scripts()
    assert len(found) >= 30, found  # the glob found the scripts
    missing = [s for s in found if s not in FIGURES]
    stale = [s for s in FIGURES if s not in found]
    flagless = [s for s in found if "add_smoke(" not in (BENCHMARKS / f"{s}.py").read_text()]
    assert not missing and not stale and not flagless, f"no figure line here for {missing}; gone: {stale}; " \
        f"no --smoke flag: {flagless}"


def test_no_benchmark_script_passes_the_size_limit():
    long = {p.name: n for p in BENCHMARKS.glob("*.py") if (n := p.read_text().count("\n")) > 400}
    assert not long, f"over 400 lines: {long}"


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(FIGURES))
def test_smoke_run_prints_its_figure(script, tmp_path):
    needed = NEEDS.get(script)
    if needed and importlib.util.find_spec(needed) is None:
        pytest.skip(f"benchmarks/{script}.py needs {needed}, not installed here")
    # the scripts' temporary folders go with the test's; torch's compile cache stays where it is shared
    compile_cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(tempfile.gettempdir(),
                                                                               f"torchinductor_{getpass.getuser()}")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1",
           "TMPDIR": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": compile_cache}
    if script == "sandbox":  # the sandbox's user (nobody) must reach its folder: pytest's are its owner's alone
        env["TMPDIR"] = tempfile.gettempdir()
    done = subprocess.run([sys.executable, str(BENCHMARKS / f"{script}.py"), "--smoke"], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    tail = done.stdout[-3000:]
    assert done.returncode == 0, f"benchmarks/{script}.py --smoke exited {done.returncode}:\n{tail}"
    for line in (FIGURES[script], ALSO.get(script, "")):
        assert re.search(line, done.stdout, re.M), f"no line matching {line!r} in:\n{tail}"
