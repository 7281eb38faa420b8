#!/usr/bin/env bash
# Session 45, call 2: the serving tests on the GPU at HEAD (dsa_llm as KIND_GPU), then the engine benchmark if time is left
set -u
nvidia-smi --query-gpu=name,power.limit,uuid --format=csv,noheader | tee $OUT/gpu.txt
start=$(date +%s)
bash benchmarks/device_checks.sh serving 2>&1 | tee $OUT/serving.txt | tail -40
echo "serving done $(( $(date +%s) - start )) s"
