#!/bin/bash
# Call 7: ours and FlashMLA across the batches where the split ends (batch_cliff.py).
source .device/setup.sh >/dev/null 2>&1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee $OUT/gpu.txt
AB_NAME=h100-batch-cliff.json python3 benchmarks/results/2026-11-26-mla-meeting/batch_cliff.py 2>&1 | tail -20
