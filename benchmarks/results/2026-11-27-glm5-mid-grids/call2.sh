#!/usr/bin/env bash
# Session 43, call 2: on an H200 the rows it lacks (128-head FP8 decode since the CTA pairs, the
# indexer at 32 heads); on an H100 the GPU tests of the kernels at this commit
set -u
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,power.limit,uuid --format=csv,noheader | tee $OUT/gpu.txt
start=$(date +%s)
if grep -q H200 $OUT/gpu.txt; then
  mkdir -p $OUT/decode; OUT=$OUT/decode timeout 260 python3 benchmarks/bench_kernels.py --only ceilings,decode --budget 230 > $OUT/decode/log.txt 2>&1
  echo "decode rc $? $(( $(date +%s) - start )) s"; grep "^|" $OUT/decode/results.md | head -40
  left=$(( 570 - $(date +%s) + start ))
  mkdir -p $OUT/h32; OUT=$OUT/h32 timeout $left python3 benchmarks/bench_kernels.py --only ceilings,indexer --index-heads 32 --budget $(( left - 40 )) > $OUT/h32/log.txt 2>&1
  echo "h32 rc $? $(( $(date +%s) - start )) s"; grep "^|" $OUT/h32/results.md | head -40
else
  bash benchmarks/device_checks.sh gpu-tests 2>&1 | tail -40 | tee $OUT/gpu-tests.txt
fi
echo "all $(( $(date +%s) - start )) s"
