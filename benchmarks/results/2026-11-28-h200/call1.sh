#!/bin/bash
# Session 53, call 1: on an H200 the unmeasured kernel rows (call5 of 2026-11-27); else the penalty baseline
set -u
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
if grep -q H200 $OUT/gpu.txt; then bash benchmarks/results/2026-11-27-glm5-mid-grids/call5.sh 2>&1 | tee $OUT/call5.log; exit 0; fi
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
for b in 1 32 64; do PYTHONPATH=$PWD/.ab/s53/base timeout 120 python3 .ab/s53/penalty_micro_old.py $b 2>&1 | tail -2; done | tee $OUT/micro.log
