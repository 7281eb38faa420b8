#!/usr/bin/env bash
# Session 43, call 4: the 32-head next_n 4 rule for 1024-key grids at 2-3 programs an SM: GPU tests, then A/B
set -u
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,power.limit,uuid --format=csv,noheader | tee $OUT/gpu.txt
start=$(date +%s)
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -k "fewer_heads or take_the_gluon or config" tests/kernels/test_indexer_logits.py 2>&1 | tail -4 | tee $OUT/gpu-tests.txt
echo "tests $(( $(date +%s) - start )) s"
SHAPES=67x4096,80x4096,96x4096,40x8192,20x16384,10x32768,12x32768,5x65536,3x131072 timeout 200 python3 benchmarks/results/2026-11-27-glm5-index-heads/ab32.py 2>&1 | tail -12
echo "all $(( $(date +%s) - start )) s"
