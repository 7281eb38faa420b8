#!/bin/bash
# Session 54, call 1: prefix caching on the v32 slice (FP8), cache on against off in one process
set -u
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null 2>&1 || exit 1
cd benchmarks
timeout 250 python3 bench_prefix_cache.py --model /tmp/v32 --prefix-len 8192 --batch 16 --rounds 3 \
    --json $OUT/call1_prefix_8k.json 2>&1 | grep -v Warning | tail -12
timeout 200 python3 bench_prefix_cache.py --model /tmp/v32 --prefix-len 32768 --batch 8 --rounds 2 \
    --json $OUT/call1_prefix_32k.json 2>&1 | grep -v Warning | tail -10
