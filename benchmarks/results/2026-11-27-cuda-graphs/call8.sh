#!/bin/bash
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
R=benchmarks/results/2026-11-27-cuda-graphs
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader
timeout 120 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null
date
timeout 200 python3 $R/bucket_cost.py --model /tmp/v32 --batch 32 --json $OUT/bucket_cost_b32.json 2>&1 | tail -2
timeout 150 python3 $R/bucket_cost.py --model /tmp/v32 --batch 4 --json $OUT/bucket_cost_b4.json 2>&1 | tail -2
date
