#!/usr/bin/env bash
# call 3, on an H200 only (an H100 ends the call at once): the head-sum A/B at every decode shape,
# then the full bench_kernels run that the H200 column of docs/PERFORMANCE.md still lacks.
source .device/setup.sh || exit 1
nvidia-smi --query-gpu=name,uuid,power.limit,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
[[ $(nvidia-smi --query-gpu=name --format=csv,noheader) == *H200* ]] || exit 0
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
export PYTHONUNBUFFERED=1
REPS=3 VARIANT_NEXT_N=4 VARIANTS='{"k2048s2": {"OVERLAP": false, "STAGES": 2, "UNROLLED": false, "KEYS_PER_PROG": 2048}}' \
  timeout 150 python3 benchmarks/results/2026-11-26-head-sum-mma/hs_ab.py > "$OUT/hs.log" 2>&1
cp /tmp/hs_ab.json "$OUT/h200-hs-ab.json"
grep -o '"cost": {[^}]*}' "$OUT/hs.log"
mkdir -p "$OUT/b" && OUT="$OUT/b" timeout 400 python3 benchmarks/bench_kernels.py --budget 310 > "$OUT/bench.log" 2>&1
echo "bench rc $?"
grep -v '^{' "$OUT/bench.log" | cut -c1-200 | tail -40
