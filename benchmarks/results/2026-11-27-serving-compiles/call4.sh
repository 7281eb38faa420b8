#!/usr/bin/env bash
# Session 45, call 4: on an H200 its two rows; else the engine benchmark at HEAD and a profile of its decode step
set -u
nvidia-smi --query-gpu=name,power.limit,uuid --format=csv,noheader | tee $OUT/gpu.txt
grep -q H200 $OUT/gpu.txt && exec bash benchmarks/results/2026-11-27-glm5-mid-grids/call5.sh
start=$(date +%s)
OUT=$OUT bash benchmarks/device_checks.sh engine 2>&1 | tail -12
echo "engine done $(( $(date +%s) - start )) s"
timeout 200 python3 .ab/s45/engine_profile.py /tmp/v32 > $OUT/engine_profile.json 2> $OUT/engine_profile.err; echo "profile rc $?"
tail -3 $OUT/engine_profile.err; head -c 2500 $OUT/engine_profile.json
echo "all done $(( $(date +%s) - start )) s"
