#!/bin/bash
# Session 57, call 1: DeepGEMM m-grouped contiguous FP8 GEMM against ours (routed experts)
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv | tee $OUT/gpu.txt
timeout 500 python3 .ab/s57/grouped_probe.py $OUT/call1_grouped.json 2>&1 | tail -40
