#!/usr/bin/env bash
set -u
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
start=$(date +%s)
export TRITON_CACHE_DIR=/tmp/tcache
timeout 150 python3 benchmarks/results/2026-11-27-warmup/warmup_time.py auto 1 8 256 16384 2>&1 | grep -v Warning | tail -6; echo "small cold $(( $(date +%s) - start )) s"
timeout 100 python3 benchmarks/results/2026-11-27-warmup/warmup_time.py auto 1 8 256 16384 2>&1 | grep -v Warning | tail -6; echo "small warm $(( $(date +%s) - start )) s"
timeout 200 python3 benchmarks/results/2026-11-27-warmup/warmup_time.py auto 1 64 2048 163840 2>&1 | grep -v Warning | tail -6; echo "default $(( $(date +%s) - start )) s"
