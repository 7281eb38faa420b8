#!/usr/bin/env bash
# Session 44, call 8: the 3/16 set-aside over layers and alone
set -u
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
start=$(date +%s)
timeout 240 python3 benchmarks/results/2026-11-27-l2-setaside/l2_layers2.py > $OUT/layers2.log 2>&1; echo "layers rc $? $(( $(date +%s) - start )) s"
