#!/usr/bin/env bash
# Session 43, call 5: on an H200 only, the 128-head FP8 decode since the CTA pairs and the indexer at 32 heads
set -u
nvidia-smi --query-gpu=name,power.limit,uuid --format=csv,noheader | tee $OUT/gpu.txt
grep -q H200 $OUT/gpu.txt || exit 0
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
start=$(date +%s)
mkdir -p $OUT/decode; OUT=$OUT/decode timeout 300 python3 benchmarks/bench_kernels.py --only ceilings,decode --budget 270 > $OUT/decode/log.txt 2>&1
echo "decode rc $? $(( $(date +%s) - start )) s"; grep "^|" $OUT/decode/results.md | grep -i "sparse\|decode" | head -40
left=$(( 560 - $(date +%s) + start ))
mkdir -p $OUT/h32; OUT=$OUT/h32 timeout $left python3 benchmarks/bench_kernels.py --only ceilings,indexer --index-heads 32 --budget $(( left - 30 )) > $OUT/h32/log.txt 2>&1
echo "h32 rc $? $(( $(date +%s) - start )) s"
