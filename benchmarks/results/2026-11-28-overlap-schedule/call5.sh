#!/bin/bash
# Session 52, call 5: overlap scheduling with a repetition penalty on every request (the penalty
# lists completed on the GPU), overlap on (graph) / off (graph-sync), v32-slice FP8, batch 32
set -u
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader | tee $OUT/gpu.txt
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
timeout 100 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null 2>&1
echo "checkpoint rc $? $(date +%T)"
timeout 240 python3 benchmarks/bench_engine.py --model /tmp/v32 --batch 32 --prompt-len 2112 --steps 32 --rounds 2 \
  --backends graph,graph-sync --repetition-penalty 1.1 --json "$OUT/engine_b32_penalty.json" 2>&1 | grep -v '^{' | tail -6
date +%T
