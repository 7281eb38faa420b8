#!/bin/bash
# Session 51, call 2: chain-draft graphs: GPU tests, then the engine A/B against b65d86f (.ab/s51/base)
# The base tree: git archive b65d86f dsa_backend benchmarks/bench_engine.py benchmarks/report.py | tar -x -C .ab/s51/base (carried with .ab/s51)
set -u
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
start=$(date +%s)
echo "== tests $(date +%T)"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_spec_chain.py tests/test_cuda_graphs.py > $OUT/tests.txt 2>&1
grep -v "^  " $OUT/tests.txt | tail -15
echo "== checkpoint $(date +%T)"
timeout 100 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null
for tree in base new; do
  echo "== engine spec2 b32 $tree $(date +%T)"
  pp=""; [ $tree = base ] && pp=$PWD/.ab/s51/base
  PYTHONPATH=$pp timeout 130 python3 benchmarks/bench_engine.py --model /tmp/v32 --batch 32 --prompt-len 2112 --steps 16 --rounds 3 \
    --backends graph --speculative-num-steps 2 --json "$OUT/engine_spec2_b32_$tree.json" 2>&1 | grep -v '^{' | tail -3
done
left=$(( 575 - $(date +%s) + start ))
echo "== spec parts new ($left s) $(date +%T)"
timeout $left python3 benchmarks/results/2026-11-27-cuda-graphs/spec_parts.py --model /tmp/v32 --batch 32 --num-steps 2 --json $OUT/spec_parts_b32.json 2>&1 | tail -2
date +%T
