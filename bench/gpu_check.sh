#!/usr/bin/env bash
# GPU check: run on a machine with CUDA (e.g. the lent H200), from the repo root.
# 1. the GPU-marked tests (Triton kernels vs references, CUDA graphs, NCCL tensor parallelism);
# 2. the kernel microbenchmark on CUDA;
# 3. ar, serial tree and async SwiftSpec side by side on the default pair (one process per group;
#    on a single GPU both groups share the device).
# Output lands in ${OUT:-gpu_out}/. Usage: bash bench/gpu_check.sh [PROMPTS] [MAX_TOKENS]
set -uo pipefail
out=${OUT:-gpu_out}
mkdir -p "$out"
prompts=${1:-5}
tokens=${2:-128}
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

$py -m pip install -q -e '.[test]' 2>&1 | tail -2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
$py -m pytest -m gpu -q -rs tests 2>&1 | tee "$out/gpu_tests.txt"
$py bench/gpu_kernels.py 2>&1 | tee "$out/gpu_kernels.txt"
$py -m swiftspec.cli models pull
$py -m swiftspec.cli bench --device cuda --modes ar,tree,async --prompts "$prompts" \
    --max-tokens "$tokens" --out "$out/bench" 2>&1 | tee "$out/bench.txt"
