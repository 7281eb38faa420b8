#!/usr/bin/env bash
# Session 48, call 1: on an H200 the open H200 rows (call5.sh); otherwise grouped MoE: microbenchmark, engine A/B, GPU tests
set -u
nvidia-smi --query-gpu=name,power.limit,uuid --format=csv,noheader | tee $OUT/gpu.txt
if grep -q H200 $OUT/gpu.txt; then bash benchmarks/results/2026-11-27-glm5-mid-grids/call5.sh; exit; fi
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
python3 -c "import torch, torch.nn.functional as F; print(torch.__version__, hasattr(F, 'grouped_mm'))"
timeout 200 python3 benchmarks/bench_moe.py --json $OUT/bench_moe.json > $OUT/bench_moe.log 2>&1; el "bench_moe rc $?"
head -8 $OUT/bench_moe.log | cut -c1-300
timeout 120 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null; el "checkpoint rc $?"
i=0
for moe in loop grouped loop grouped; do
  i=$((i+1))
  MOE=$moe timeout 100 python3 benchmarks/results/2026-11-27-grouped-moe/engine_ab.py --model /tmp/v32 --batch 32 --prompt-len 2112 --steps 16 \
    --backends kernel --json $OUT/engine_${i}_${moe}.json > $OUT/engine_${i}_${moe}.log 2>&1
  el "engine $i $moe rc $?"; grep "decode steps" $OUT/engine_${i}_${moe}.log
done
left=$(( 570 - $(date +%s) + start ))
timeout $left python3 -m pytest -m gpu -q tests/test_moe.py tests/test_batch_invariance.py tests/test_models.py \
  > $OUT/gpu_tests.log 2>&1; el "gpu tests rc $?"; tail -5 $OUT/gpu_tests.log
