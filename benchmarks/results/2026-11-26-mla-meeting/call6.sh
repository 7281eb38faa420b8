#!/bin/bash
# Call 6, the kept kernel (MERGES = 2, 4): the kernel and attention GPU tests, the A/B against the
# committed kernels, and the official decode section.
source .device/setup.sh >/dev/null 2>&1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee $OUT/gpu.txt
AB_NAME=h100-meet-ab-kept.json python3 benchmarks/results/2026-11-26-mla-meeting/meet_ab.py 2>&1 | tail -12
python3 benchmarks/bench_kernels.py --only ceilings,decode --budget 150 2>&1 | grep -i "sparse mla\|error" | tail -14
python3 -m pytest -q -m gpu tests/test_attention.py tests/kernels 2>&1 | tail -5 | tee $OUT/gpu-tests.txt
