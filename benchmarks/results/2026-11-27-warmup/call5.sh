#!/usr/bin/env bash
set -u
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
start=$(date +%s)
LIBS=auto BREAKDOWN=0 timeout 150 python3 benchmarks/results/2026-11-27-extend-pieces/extend_pieces.py 2>&1 | grep -v Warn | tail -8; echo "pieces $(( $(date +%s) - start )) s"
timeout 330 python3 -m pytest -q -m gpu tests/test_warmup.py -x --durations=3 2>&1 | tail -8; echo "warmup tests $(( $(date +%s) - start )) s"
timeout 40 python3 benchmarks/results/2026-11-27-warmup/warmup_time.py auto 1 8 256 16384 2>&1 | grep -v Warn | tail -4; echo "small warm $(( $(date +%s) - start )) s"
left=$(( 575 - $(date +%s) + start ))
[ $left -gt 60 ] && timeout $left python3 -m pytest -q -m gpu tests/test_attention.py -x 2>&1 | tail -3; echo "attention $(( $(date +%s) - start )) s"
