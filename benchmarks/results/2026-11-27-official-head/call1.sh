#!/usr/bin/env bash
# Session 45, call 1: the official run at HEAD (every section), then the indexer at 32 heads
set -u
nvidia-smi --query-gpu=name,power.limit,uuid --format=csv,noheader | tee $OUT/gpu.txt
# an H200: its two unmeasured rows first
grep -q H200 $OUT/gpu.txt && exec bash benchmarks/results/2026-11-27-glm5-mid-grids/call5.sh
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
start=$(date +%s)
mkdir -p $OUT/official; OUT=$OUT/official timeout 360 python3 benchmarks/bench_kernels.py --budget 330 > $OUT/official/log.txt 2>&1
echo "official rc $? $(( $(date +%s) - start )) s"; grep "^|" $OUT/official/results.md | head -80
left=$(( 570 - $(date +%s) + start ))
mkdir -p $OUT/h32; OUT=$OUT/h32 timeout $left python3 benchmarks/bench_kernels.py --only ceilings,indexer --index-heads 32 --budget $(( left - 30 )) > $OUT/h32/log.txt 2>&1
echo "h32 rc $? $(( $(date +%s) - start )) s"
