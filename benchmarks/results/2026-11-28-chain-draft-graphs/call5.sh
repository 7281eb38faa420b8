#!/bin/bash
# Session 51, call 5: on an H200 the 128-head decode and 32-head indexer (glm5-mid-grids call5); else the GLM-5 slice with FP8 weights
set -u
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
if grep -q H200 $OUT/gpu.txt; then bash benchmarks/results/2026-11-27-glm5-mid-grids/call5.sh; exit 0; fi
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
start=$(date +%s)
echo "== glm5 checkpoint $(date +%T)"
timeout 100 python3 -m dsa_backend.tools.make_checkpoint --arch glm_moe_dsa --preset glm5-slice --out /tmp/glm5 --fp8 >/dev/null
echo "== glm5 fp8 keep vs dequantize b32 $(date +%T)"
timeout 240 python3 benchmarks/bench_engine.py --model /tmp/glm5 --batch 32 --prompt-len 2112 --steps 16 --rounds 2 \
  --backends graph --fp8-weights keep,dequantize --json $OUT/engine_glm5_fp8_b32.json 2>&1 | grep -v '^{' | tail -4
left=$(( 540 - $(date +%s) + start ))
echo "== glm5 spec2 b32 ($left s) $(date +%T)"
timeout $left python3 benchmarks/bench_engine.py --model /tmp/glm5 --batch 32 --prompt-len 2112 --steps 16 --rounds 2 \
  --backends graph --speculative-num-steps 2 --json $OUT/engine_glm5_spec2_b32.json 2>&1 | grep -v '^{' | tail -2
date +%T
