#!/bin/bash
# Call 1: GPU tests of the meeting (sparse MLA) and of the shared counters (top-k), the A/B against
# the committed kernels, and the official decode section.
set -x
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,uuid,power.limit --format=csv,noheader | tee $OUT/gpu.txt
python3 -m pytest -q -m gpu tests/kernels/test_sparse_mla.py tests/kernels/test_topk_cooperative.py -x 2>&1 | tail -25 | tee $OUT/gpu-tests.txt
AB_NAME=h100-meet-ab-1.json python3 benchmarks/results/2026-11-26-mla-meeting/meet_ab.py 2>&1 | tail -30
python3 benchmarks/bench_kernels.py --only ceilings,decode --budget 150 2>&1 | tail -5
ls $OUT
