#!/usr/bin/env bash
# The checks that need a GPU, in one go, on a machine with one and `pip install 'grouprl[vllm]'`:
# the vLLM engine's tests on its GPU build (weight pushes, log-probs, LoRA, every algorithm, resume,
# agents), one-process training on the GPU (a process group of one over NCCL, FSDP2 and DDP, with the
# built-in engine and with vLLM), then the rollout benchmark (built-in engine, vLLM and
# model.generate on the GPU, bf16).
#
#     bash benchmarks/gpu.sh [OUT_DIR] [tests|bench|all]      logs in OUT_DIR (default: gpu-results)
#
# The compiled-engine test is left out: it checks the CPU build's vllm_compile switch, and a GPU
# engine is always compiled.
set -uo pipefail
out=${1:-gpu-results}
what=${2:-all}
mkdir -p "$out"
cd "$(dirname "$0")/.." || exit 1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
status=0
if [[ $what != bench ]]; then
    python3 -m pytest -q -rs --durations=15 tests/trainer/test_gpu.py tests/rollout/test_vllm.py \
        -k "not a_compiled_engine_follows" 2>&1 | tee "$out/tests.log" || status=1
fi
if [[ $what != tests ]]; then
    python3 benchmarks/rollout.py --formats bf16 --repeats 3 2>&1 | tee "$out/rollout.log" || status=1
fi
exit $status
