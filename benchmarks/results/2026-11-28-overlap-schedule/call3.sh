#!/bin/bash
# Session 52, call 3: RMSNorm and RoPE in one kernel each. GPU tests; engine A/B against 68c0014
# (overlap scheduling, torch norms and RoPE), whose dsa_backend is carried in .ab/s52/base; forward profile
set -u
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
start=$(date +%s)
(timeout 100 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null 2>&1; echo "checkpoint rc $?" > $OUT/ckpt.txt) &
echo "== tests $(date +%T)"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_norm_rope.py tests/test_models.py tests/test_cuda_graphs.py tests/test_overlap.py > $OUT/tests.txt 2>&1
grep -v "^  " $OUT/tests.txt | tail -8
wait; cat $OUT/ckpt.txt
for b in 32 1; do for round in 1 2; do for tree in new base; do
  left=$(( 585 - $(date +%s) + start )); [ $left -lt 50 ] && break 3
  echo "== b$b $tree round $round ($left s) $(date +%T)"
  pp=""; [ $tree = base ] && pp=$PWD/.ab/s52/base
  PYTHONPATH=$pp timeout $(( left < 120 ? left : 120 )) python3 benchmarks/bench_engine.py --model /tmp/v32 --batch $b --prompt-len 2112 --steps 32 --rounds 2 \
    --backends graph --json "$OUT/engine_b${b}_${tree}_$round.json" 2>&1 | grep "^graph" | tail -2
done; done; done
left=$(( 585 - $(date +%s) + start ))
[ $left -gt 70 ] && timeout $left python3 benchmarks/results/2026-11-28-overlap-schedule/forward_profile.py --model /tmp/v32 --batch 32 \
  --json $OUT/profile_b32.json > $OUT/profile_b32.log 2>&1 && python3 -c "import json; d=json.load(open('$OUT/profile_b32.json')); print({k: d[k] for k in ('graph_replay_gpu_ms', 'eager_kernel_ms', 'kernels_a_forward', 'groups_ms')})"
date +%T
