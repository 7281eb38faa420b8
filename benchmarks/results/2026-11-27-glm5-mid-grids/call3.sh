#!/usr/bin/env bash
# Session 43, call 3: on an H200 the rows it lacks; on an H100 the 32-head next_n 4 grids of 1024-key
# chunks at 2-3 programs an SM (a config sweep), then the official indexer section at 32 heads
set -u
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,power.limit,uuid --format=csv,noheader | tee $OUT/gpu.txt
start=$(date +%s)
if grep -q H200 $OUT/gpu.txt; then
  mkdir -p $OUT/decode; OUT=$OUT/decode timeout 260 python3 benchmarks/bench_kernels.py --only ceilings,decode --budget 230 > $OUT/decode/log.txt 2>&1
  echo "decode rc $? $(( $(date +%s) - start )) s"; grep "^|" $OUT/decode/results.md | head -40
  left=$(( 570 - $(date +%s) + start ))
else
  HEADS=32 SHAPES=80x4096,96x4096,40x8192,20x16384,10x32768,3x131072 NEXT_NS=4 timeout 300 python3 benchmarks/results/2026-11-27-glm5-index-heads/sweep32.py 2>&1 | tail -8
  echo "sweep $(( $(date +%s) - start )) s"
  left=$(( 570 - $(date +%s) + start ))
fi
mkdir -p $OUT/h32; OUT=$OUT/h32 timeout $left python3 benchmarks/bench_kernels.py --only ceilings,indexer --index-heads 32 --budget $(( left - 40 )) > $OUT/h32/log.txt 2>&1
echo "h32 rc $? $(( $(date +%s) - start )) s"; grep "^|" $OUT/h32/results.md | head -40
echo "all $(( $(date +%s) - start )) s"
