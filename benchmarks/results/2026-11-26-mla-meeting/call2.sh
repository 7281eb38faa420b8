#!/bin/bash
# Call 2: the share's partials staged by cp.async; the meeting's GPU tests, then the A/B.
source .device/setup.sh >/dev/null 2>&1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee $OUT/gpu.txt
python3 -m pytest -q -m gpu tests/kernels/test_sparse_mla.py -x -k "meet or gluon" 2>&1 | tail -5 | tee $OUT/gpu-tests.txt
AB_NAME=h100-meet-ab-2.json python3 benchmarks/results/2026-11-26-mla-meeting/meet_ab.py 2>&1 | tail -30
