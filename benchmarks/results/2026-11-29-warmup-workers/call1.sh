#!/bin/bash
# Session 60, call 1: where the engine alone stalls at concurrency 8
set -u
source .device/setup.sh && mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && ln -sfn "$PWD/client" /tmp/dsa/dsa_client
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa.pth"
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader
t0=$(date +%s)
python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 > /dev/null 2>&1 || echo checkpoint failed
echo "checkpoint $(( $(date +%s) - t0 )) s"
timeout 240 python3 benchmarks/results/2026-11-29-warmup-workers/stall_probe.py --no-libs 2>&1 | grep -v "^INFO" | tail -60 | tee $OUT/probe_nolibs.txt
echo "--- with libs $(( $(date +%s) - t0 )) s"
timeout 200 python3 benchmarks/results/2026-11-29-warmup-workers/stall_probe.py 2>&1 | grep -v "^INFO" | tail -60 | tee $OUT/probe_libs.txt
echo "done $(( $(date +%s) - t0 )) s"
