#!/usr/bin/env bash
# Session 45, call 3: every GPU test at HEAD: batch invariance, kernels + attention, then sparse MLA's
set -u
nvidia-smi --query-gpu=name,power.limit,uuid --format=csv,noheader | tee $OUT/gpu.txt
grep -q H200 $OUT/gpu.txt && exec bash benchmarks/results/2026-11-27-glm5-mid-grids/call5.sh
start=$(date +%s)
bash benchmarks/device_checks.sh gpu-tests 2>&1 | tee $OUT/gpu-tests.txt | tail -8
echo "gpu-tests done $(( $(date +%s) - start )) s"
left=$(( 580 - $(date +%s) + start ))
source .device/setup.sh
timeout $left python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_sparse_mla.py 2>&1 | grep -v "^  " | tee $OUT/gpu-tests-mla.txt | tail -8
echo "mla done $(( $(date +%s) - start )) s"
