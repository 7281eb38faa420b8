#!/usr/bin/env bash
# host_ab2.py: the kernels before (.ab/kernels_before: e73e7cc) and after, in one process.
source .device/setup.sh >/dev/null 2>&1 || exit 1
mkdir -p /tmp/dsa
ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/.ab/kernels_before/kernels" /tmp/dsa/dsa_kernels_before
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee "$OUT/gpu.txt"
PYTHONUNBUFFERED=1 timeout 300 python3 benchmarks/results/2026-11-26-host-cost/host_ab2.py 2>&1 | grep -v Warn
