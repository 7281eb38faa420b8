#!/usr/bin/env bash
# Session 48, call 2: the model-level GPU tests (new stage), batch invariance, engine A/B rounds 2
set -u
start=$(date +%s)
el() { echo "[$(( $(date +%s) - start )) s] $*"; }
bash benchmarks/device_checks.sh gpu-tests-model 2>&1 | tail -6; el "model tests"
source .device/setup.sh
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_batch_invariance.py 2>&1 | tail -3; el "batch invariance"
timeout 120 python3 -m dsa_backend.tools.make_checkpoint --arch deepseek_v32 --preset v32-slice --out /tmp/v32 --fp8 >/dev/null; el "checkpoint rc $?"
i=4
for moe in grouped loop grouped loop; do
  i=$((i+1))
  [ $(( $(date +%s) - start )) -gt 480 ] && break
  MOE=$moe timeout 90 python3 benchmarks/results/2026-11-27-grouped-moe/engine_ab.py --model /tmp/v32 --batch 32 --prompt-len 2112 --steps 16 \
    --backends kernel --json $OUT/e${i}_${moe}.json > $OUT/e${i}_${moe}.log 2>&1
  el "engine $i $moe rc $?"; grep "decode steps" $OUT/e${i}_${moe}.log
done
