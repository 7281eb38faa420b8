#!/usr/bin/env bash
# Top-k meetings without a barrier (histogram words stamped with the launch): GPU tests and A/B against the committed kernel.
source .device/setup.sh || exit 1
mkdir -p /tmp/dsa && ln -sfn "$PWD/kernels" /tmp/dsa/dsa_kernels
echo /tmp/dsa > "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_dsa_kernels.pth"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_topk_cooperative.py tests/kernels/test_topk.py \
  2>&1 | grep -v "^  " | tail -15 | tee "$OUT/gpu-tests.txt"
timeout 340 python3 benchmarks/topk_ab.py quick base=.ab/base.py > "$OUT/ab.log" 2>&1
echo "ab rc $?"
grep -v '^rows' "$OUT/ab.log" | cut -c1-400 | tail -30
python3 - "$OUT/topk_ab.json" <<'PY'
import json, sys, collections
r = json.load(open(sys.argv[1]))
best = collections.defaultdict(dict)
for row in r["rows"]:
    k = (tuple(row["shape"]), row["kernel"])
    for f in ("alone_us", "behind_us"):
        best[k][f] = min(best[k].get(f, 1e9), row[f])
    best[k]["indexer"] = row["indexer_us"]; best[k]["exact"] = row["exact"]
for (shape, kern), v in sorted(best.items()):
    print(shape, f"{kern:22s}", "alone %.2f behind %.2f share %.3f exact %s" % (v["alone_us"], v["behind_us"], v["behind_us"] / v["indexer"], v["exact"]))
PY
