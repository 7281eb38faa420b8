#!/bin/bash
# Session 52, call 4: on an H200, issue 4's unmeasured rows (call5.sh of 2026-11-27) and nothing else.
# Otherwise: the serving tests on the GPU (dsa_llm KIND_GPU, overlap scheduling on by default; packed
# without DeepGEMM / FlashMLA, for the stub's numpy wheel), then the overlap and sampling GPU tests.
set -u
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
if grep -q H200 $OUT/gpu.txt; then bash benchmarks/results/2026-11-27-glm5-mid-grids/call5.sh; exit 0; fi
start=$(date +%s)
bash benchmarks/device_checks.sh serving 2>&1 | tee $OUT/serving.txt | tail -30
echo "serving done $(( $(date +%s) - start )) s"
source .device/setup.sh
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_overlap.py tests/test_sampling.py 2>&1 | grep -v "^  " | tail -6
date +%T
