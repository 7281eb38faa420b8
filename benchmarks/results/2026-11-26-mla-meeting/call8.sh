#!/bin/bash
# Call 8: every split count 1-8 past the split's end (split_sweep.py).
source .device/setup.sh >/dev/null 2>&1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee $OUT/gpu.txt
AB_NAME=h100-split-sweep.json python3 benchmarks/results/2026-11-26-mla-meeting/split_sweep.py 2>&1 | tail -20
