#!/usr/bin/env bash
# Session 44, call 5: the set-aside over layers (failed at its first line: a device without an index), then the
# official sections with and without half of L2 set aside. --l2-setaside was a flag of bench_kernels.py in the
# working tree then (dsa_kernels.reserve_l2_for_logits before the sections, half of L2); not committed.
set -u
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
start=$(date +%s)
SIXTEENTHS=8 timeout 190 python3 benchmarks/results/2026-11-27-l2-setaside/l2_layers2.py > $OUT/layers2.log 2>&1; echo "layers rc $? $(( $(date +%s) - start )) s"
mkdir -p $OUT/on $OUT/off
OUT=$OUT/on timeout 200 python3 benchmarks/bench_kernels.py --only ceilings,indexer,topk --l2-setaside --budget 170 > $OUT/on/log.txt 2>&1; echo "on rc $? $(( $(date +%s) - start )) s"
left=$(( 570 - $(date +%s) + start ))
OUT=$OUT/off timeout $left python3 benchmarks/bench_kernels.py --only ceilings,indexer,topk --budget $(( left - 40 )) > $OUT/off/log.txt 2>&1; echo "off rc $? $(( $(date +%s) - start )) s"
