#!/usr/bin/env bash
# Session 48, call 4: no read back in decode / verify forwards: GPU tests, sync census, engine A/B
set -u
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
bash benchmarks/device_checks.sh gpu-tests-model 2>&1 | tail -3; el "model tests"
source .device/setup.sh

python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset tiny --out /tmp/tiny >/dev/null
timeout 100 python3 benchmarks/results/2026-11-27-no-read-back/syncs.py /tmp/tiny 2>&1 | grep "==\|  [0-9]" | head -20; el "census"
timeout 120 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null; el "checkpoint rc $?"
i=0
for sync in 1 0 1 0 1 0; do
  i=$((i+1))
  [ $(( $(date +%s) - start )) -gt 500 ] && break
  SYNC=$sync timeout 90 python3 benchmarks/results/2026-11-27-no-read-back/engine_sync_ab.py --model /tmp/v32 --batch 32 --prompt-len 2112 --steps 16 \
    --backends kernel --json $OUT/s${i}_sync${sync}.json > $OUT/s${i}_sync${sync}.log 2>&1
  el "engine $i sync=$sync rc $?"; grep "decode steps" $OUT/s${i}_sync${sync}.log
done
timeout $(( 585 - $(date +%s) + start )) python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention.py 2>&1 | tail -2; el "attention gpu tests"
