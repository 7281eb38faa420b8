#!/usr/bin/env bash
# Session 43, call 1: on an H200 the 128-head decode and the 32-head indexer; then the cluster top-k A/B
set -u
source .device/setup.sh
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels && echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
nvidia-smi --query-gpu=name,power.limit,uuid --format=csv,noheader | tee $OUT/gpu.txt
start=$(date +%s)
timeout 90 python3 .ab/ck/clusters.py 2>&1 | tail -8 | tee $OUT/clusters.txt
timeout 320 python3 benchmarks/topk_ab.py quick rounds=2 ck=.ab/ck/ck.py cb=.ab/ck/cb.py shapes=32x32768,16x32768,32x4096,64x32768,8x32768,128x32768 > $OUT/ab.log 2>&1; echo "ab rc $?"
echo "ab $(( $(date +%s) - start )) s"
python3 - <<'PY'
import json, os, collections
f = os.environ["OUT"] + "/topk_ab.json"
r = json.load(open(f))
print(r["gpu"], r["notes"])
bad = [c for c in r["checks"] if c["wrong"]]
print("wrong checks", len(bad), bad[:6])
best = collections.defaultdict(lambda: 1e9); alone = collections.defaultdict(lambda: 1e9)
for row in r["rows"]:
    k = (tuple(row["shape"]), row["kernel"])
    best[k] = min(best[k], row["behind_us"]); alone[k] = min(alone[k], row["alone_us"])
for s in sorted({k[0] for k in best}):
    print(s, "behind", {k[1]: round(v, 2) for k, v in best.items() if k[0] == s}, "alone", {k[1]: round(v, 2) for k, v in alone.items() if k[0] == s})
PY
left=$(( 560 - $(date +%s) + start ))
if grep -q H200 $OUT/gpu.txt && [ $left -gt 150 ]; then
  mkdir -p $OUT/decode; OUT=$OUT/decode timeout $left python3 benchmarks/bench_kernels.py --only ceilings,decode --budget $(( left - 40 )) > $OUT/decode/log.txt 2>&1
  tail -30 $OUT/decode/results.md
fi
echo "all $(( $(date +%s) - start )) s"
