#!/bin/bash
# Session 52, call 2: where the GPU-bound decode forward's time goes (batch 32 and 1, v32-slice FP8);
# overlap A/B on the GLM-5 slice
set -u
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
start=$(date +%s)
timeout 100 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null 2>&1 &
timeout 100 python3 -m dsa_backend.tools.make_checkpoint --arch glm_moe_dsa --preset glm5-slice --out /tmp/glm5 --fp8 >/dev/null 2>&1 &
wait
echo "== checkpoints $(( $(date +%s) - start )) s"
for b in 32 1; do
  echo "== profile b$b $(date +%T)"
  timeout 200 python3 benchmarks/results/2026-11-28-overlap-schedule/forward_profile.py --model /tmp/v32 --batch $b \
    --json $OUT/profile_b$b.json > $OUT/profile_b$b.log 2>&1; echo "rc $?"
  python3 -c "import json; d=json.load(open('$OUT/profile_b$b.json')); print({k: d[k] for k in ('graph_replay_gpu_ms', 'eager_kernel_ms', 'kernels_a_forward', 'groups_ms')}); [print(t) for t in d['top'][:18]]" 2>&1 | tail -22
done
left=$(( 585 - $(date +%s) + start ))
echo "== glm5 b32 ($left s) $(date +%T)"
[ $left -gt 90 ] && timeout $left python3 benchmarks/bench_engine.py --model /tmp/glm5 --batch 32 --prompt-len 2112 --steps 32 --rounds 3 \
    --backends graph,graph-sync --json "$OUT/engine_glm5_b32.json" 2>&1 | grep -v '^{' | tail -7
date +%T
