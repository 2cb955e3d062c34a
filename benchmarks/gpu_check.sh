#!/usr/bin/env bash
# Offline GPU check (docs/bench/gpu-check.md): run from the repo root on a machine with CUDA, e.g.
# a lent device with no network.  Installs nothing and needs no model files: the repository goes on
# PYTHONPATH, the models are random pairs of the default pair's shapes built on the device, and
# only torch (+ Triton on CUDA, pytest for step 1) must be installed.  Results (gpu_check.json,
# gpu_check.md, gpu_tests.txt, gpu_check.log) land in ${OUT:-gpu_out}/.
# Usage: bash benchmarks/gpu_check.sh [benchmarks/gpu_check.py options, e.g. --steps 2,3 or --device cpu --tiny]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_out}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export MAX_JOBS=${MAX_JOBS:-$(nproc)}  # the C++ CPU kernels' JIT build (step 5) on every core
py=${PYTHON:-python3}
$py benchmarks/gpu_check.py --out "$out" "$@" 2>&1 | tee "$out/gpu_check.log"
