#!/usr/bin/env bash
# Session 48, call 6: the engine A/B in one process, alternating rounds
set -u
start=$(date +%s)
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
timeout 120 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null
echo "[$(( $(date +%s) - start )) s] checkpoint rc $?"
timeout 400 python3 benchmarks/results/2026-11-27-no-read-back/engine_rounds.py /tmp/v32 6 $OUT/engine_rounds.json 2>&1 | grep "decode steps\|gpu" | cut -c1-400
echo "[$(( $(date +%s) - start )) s] rounds rc $?"
