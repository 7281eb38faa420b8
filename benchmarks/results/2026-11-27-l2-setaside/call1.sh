#!/usr/bin/env bash
# Session 44, call 1: on an H200 the session-43 call5 (128-head decode, 32-head indexer); on an H100 the L2-window A/B
set -u
nvidia-smi --query-gpu=name,power.limit,uuid --format=csv,noheader | tee $OUT/gpu.txt
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
if grep -q H200 $OUT/gpu.txt; then
  bash benchmarks/results/2026-11-27-glm5-mid-grids/call5.sh
else
  timeout 540 python3 benchmarks/results/2026-11-27-l2-setaside/l2win_ab.py 2>&1 | tail -80
fi
